"""`payouts payout create|start-pending|list`: create payouts, start their workflows, follow
them (`--wait`) and list them (`payout status|show` are `payouts.status_cli`'s).

Bad input gets a one-line error and a non-zero exit, and creates nothing: a batch is validated
whole before the first payout is written. The operator signals (`payout abandon|revoke`) are
`payouts.operator_cli`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path
from typing import Any

from common import tracing
from payouts import list_cli
from payouts.batch import PayoutSpec, check_batch, generate, parse_spec, read_batch
from payouts.errors import (
    EXIT_NOT_TERMINAL,
    EXIT_UNAVAILABLE,
    CommandError,
    guard,
)
from payouts.follow import follow_payouts, terminal_count
from payouts.settings import connection_options, database_url, task_queue, temporal_address
from payouts.stackcheck import refuse_other_stack
from payouts.workload import connect_temporal, create_payouts, start_workflows, stranded_payouts


def _cmd_create(args: argparse.Namespace) -> int:
    if args.file:
        specs = read_batch(Path(args.file))
    elif args.generate:
        if args.accounts <= 0:
            raise CommandError("--accounts must be positive")
        specs = generate(
            args.generate,
            args.accounts,
            seed=args.seed,
            min_amount=args.min_amount,
            max_amount=args.max_amount,
        )
    else:
        if args.account is None or args.amount is None:
            raise CommandError(
                "a single payout needs --account and --amount (or use --file or --generate)"
            )
        specs = [
            parse_spec(
                {
                    "payout_id": args.payout_id or f"po-{uuid.uuid4().hex[:12]}",
                    "account_id": args.account,
                    "amount": args.amount,
                },
                "payout",
            )
        ]
    check_batch(specs)
    tracing.setup("payouts-cli")  # each start is the root of its payout's trace
    asyncio.run(_create_and_start(args, specs))
    verb = "created" if args.no_start else "created and started"
    print(f"{verb} {len(specs)} payout(s); follow them in the Temporal UI as payout-<id>")
    for s in specs[:10]:
        print(f"  payout-{s.payout_id}  account={s.account_id}  amount={s.amount}")
    if args.wait and not args.no_start:
        counts = asyncio.run(
            follow_payouts(
                database_url(args, "PAYDB_DATABASE_URL"),
                [s.payout_id for s in specs],
                args.wait_timeout,
            )
        )
        print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return 0 if terminal_count(counts) == len(specs) else EXIT_NOT_TERMINAL
    return 0


async def _create_and_start(args: argparse.Namespace, specs: list[PayoutSpec]) -> None:
    """Rows, then workflows, as one recoverable operation: Temporal is reached before any row is
    written, and if starting still fails half-way, `payout start-pending` starts the rest."""
    db_url = database_url(args, "PAYDB_DATABASE_URL")  # a missing one: before any connect
    client = None if args.no_start else await connect_temporal(temporal_address(args))
    if client is not None:
        # A row in one stack's database and its workflow on another's Temporal would be a
        # payout nothing drives and a workflow whose store has no such payout: refused first.
        await refuse_other_stack(client, temporal_address(args), db_url)
    await create_payouts(db_url, specs)
    if client is None:
        return
    try:
        await start_workflows(temporal_address(args), task_queue(args), specs, client=client)
    except RuntimeError as exc:
        raise CommandError(
            f"created {len(specs)} payout(s) but could not start every workflow ({exc}); "
            "run `payouts payout start-pending` to start the missing ones",
            EXIT_UNAVAILABLE,
        ) from None


def _cmd_start_pending(args: argparse.Namespace) -> int:
    tracing.setup("payouts-cli")
    specs, started = asyncio.run(_start_stranded(args))
    by_state: dict[str, int] = {}
    for s in specs:
        by_state[s.state] = by_state.get(s.state, 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())) or "none"
    print(
        f"{len(specs)} payout(s) with no running workflow ({states}): started {started} "
        f"workflow(s), {len(specs) - started} had one meanwhile"
    )
    return 0


async def _start_stranded(args: argparse.Namespace) -> tuple[list[PayoutSpec], int]:
    """Every non-terminal payout nothing drives (never started, or its workflow terminated or
    reset away): a new workflow for each, which goes on by state and evidence (never a second
    submit: activities.redrive)."""
    db_url = database_url(args, "PAYDB_DATABASE_URL")  # a missing one: before any connect
    client = await connect_temporal(temporal_address(args))
    await refuse_other_stack(client, temporal_address(args), db_url)
    specs = await stranded_payouts(db_url, client, args.payout)
    started = await start_workflows(temporal_address(args), task_queue(args), specs, client=client)
    return specs, started


def register(sub: Any) -> Any:
    """`payouts payout` and its subcommands; returns its subparsers for the operator signals."""
    payout = sub.add_parser("payout", help="create payouts, query them, send operator signals")
    psub = payout.add_subparsers(dest="payout_command", required=True)
    create = psub.add_parser("create", help="create payouts and start their workflows")
    create.add_argument("--account", help="account of a single payout")
    create.add_argument("--amount", type=int, help="amount of a single payout (minor units)")
    create.add_argument("--payout-id", help="id of a single payout (default: generated)")
    create.add_argument("--file", help="a .json list or .csv (payout_id,account_id,amount)")
    create.add_argument("--generate", type=int, metavar="N", help="generate N payouts")
    create.add_argument("--accounts", type=int, default=50, help="accounts for --generate")
    create.add_argument("--seed", type=int, default=1, help="seed for --generate")
    create.add_argument(
        "--min-amount", type=int, default=100, help="smallest generated amount (minor units)"
    )
    create.add_argument(
        "--max-amount", type=int, default=5_000, help="largest generated amount (minor units)"
    )
    create.add_argument("--no-start", action="store_true", help="create rows only")
    create.add_argument(
        "--wait",
        action="store_true",
        help="follow the payouts to terminal states with a progress bar, then a summary "
        "(exit 6 if some were not terminal by --wait-timeout)",
    )
    create.add_argument(
        "--wait-timeout", type=float, default=3600.0, help="seconds --wait follows them"
    )
    connection_options(create, db=True, temporal=True)
    create.set_defaults(func=guard(_cmd_create))

    pending = psub.add_parser(
        "start-pending",
        help="start a workflow for every non-terminal payout that has none running (never "
        "started, or terminated): it goes on by state and evidence (idempotent)",
    )
    pending.add_argument(
        "--payout",
        action="append",
        metavar="ID",
        help="only this payout (repeatable), e.g. right after terminating its workflow",
    )
    connection_options(pending, db=True, temporal=True)
    pending.set_defaults(func=guard(_cmd_start_pending))

    list_cli.register(psub)  # from the payment database

    return psub
