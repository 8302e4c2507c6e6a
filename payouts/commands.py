"""Operator and workload commands: `payouts seed`, `payouts payout create|status|abandon|revoke`,
`payouts lock revoke`.

Bad input gets a one-line error and a non-zero exit, and creates nothing: a batch is validated
whole before the first payout is written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx

from common.credentials import (
    OPERATOR_TOKEN_FILE_ENV,
    CredentialsError,
    auth_headers,
    operator_token,
)
from common.lockkey import lock_key
from ledger.states import TERMINAL_STATES
from payouts.cli import database_url

if TYPE_CHECKING:
    from activities.models import OperatorCommand

DEFAULT_TEMPORAL = "127.0.0.1:7233"
DEFAULT_QUEUE = "payouts"
MAX_BATCH = 100_000


#: Exit codes of `payouts payout|seed|lock` commands (documented in the README).
EXIT_USAGE = 2  # bad arguments or input; nothing was changed
EXIT_NOT_FOUND = 3  # no such payout (no workflow for it)
EXIT_CONFLICT = 4  # the payout's workflow has completed: nothing left to signal
EXIT_UNAVAILABLE = 5  # Temporal, the database or the lock server could not be reached


class CommandError(Exception):
    """A user-facing error: printed as one line on stderr, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PayoutSpec:
    payout_id: str
    account_id: str
    amount: int


def temporal_address(args: argparse.Namespace) -> str:
    return str(
        getattr(args, "temporal", None) or os.environ.get("TEMPORAL_ADDRESS", DEFAULT_TEMPORAL)
    )


def task_queue(args: argparse.Namespace) -> str:
    return str(
        getattr(args, "task_queue", None) or os.environ.get("WORKER_TASK_QUEUE", DEFAULT_QUEUE)
    )


# --------------------------------------------------------------------------- parsing input


def _spec(raw: dict[str, Any], where: str) -> PayoutSpec:
    try:
        payout_id = str(raw["payout_id"]).strip()
        account_id = str(raw["account_id"]).strip()
        amount_raw = raw["amount"]
    except KeyError as exc:
        raise CommandError(f"{where}: missing field {exc.args[0]!r}") from None
    try:
        amount = int(str(amount_raw).strip())
    except ValueError:
        raise CommandError(
            f"{where}: amount {amount_raw!r} is not an integer (minor units)"
        ) from None
    if not payout_id or not account_id:
        raise CommandError(f"{where}: payout_id and account_id must not be empty")
    if amount <= 0:
        raise CommandError(f"{where}: amount must be positive, got {amount}")
    return PayoutSpec(payout_id, account_id, amount)


def read_batch(path: Path) -> list[PayoutSpec]:
    """Payouts from a JSON list of objects or a CSV with a header payout_id,account_id,amount."""
    if not path.exists():
        raise CommandError(f"{path}: no such file")
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{path}: invalid JSON ({exc})") from None
        if not isinstance(rows, list):
            raise CommandError(f"{path}: expected a JSON list of payouts")
    elif path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        raise CommandError(f"{path}: expected a .json or .csv file")
    specs = [
        _spec(r if isinstance(r, dict) else {}, f"{path}: item {i + 1}") for i, r in enumerate(rows)
    ]
    check_batch(specs)
    return specs


def check_batch(specs: list[PayoutSpec]) -> None:
    if not specs:
        raise CommandError("no payouts given")
    if len(specs) > MAX_BATCH:
        raise CommandError(f"at most {MAX_BATCH} payouts per batch")
    seen: set[str] = set()
    for s in specs:
        if s.payout_id in seen:
            raise CommandError(f"payout id {s.payout_id} appears twice in the batch")
        seen.add(s.payout_id)


def generate(
    count: int,
    accounts: int,
    *,
    seed: int,
    min_amount: int,
    max_amount: int,
    account_prefix: str = "acct-",
) -> list[PayoutSpec]:
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:6]
    return [
        PayoutSpec(
            payout_id=f"po-{run}-{i:06d}",
            account_id=f"{account_prefix}{rng.randrange(accounts):05d}",
            amount=rng.randint(min_amount, max_amount),
        )
        for i in range(count)
    ]


# --------------------------------------------------------------------------- actions


async def seed_accounts(db_url: str, count: int, balance: int, prefix: str) -> list[str]:
    from ledger import PayoutStore, WorkContext
    from ledger.errors import DuplicateAccount

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    created = []
    try:
        store = PayoutStore(pool)
        for i in range(count):
            account_id = f"{prefix}{i:05d}"
            ctx = WorkContext(correlation_id=f"seed:{account_id}", actor="payouts-seed")
            with contextlib.suppress(DuplicateAccount):
                # Seeding is re-runnable: an existing account is topped up.
                await store.create_account(account_id, ctx)
            await store.fund_account(account_id, balance, ctx)
            created.append(account_id)
    finally:
        await pool.close()
    return created


async def create_payouts(db_url: str, specs: list[PayoutSpec]) -> None:
    """All or nothing: unknown accounts and duplicate ids are found before any write."""
    from ledger import PayoutStore, WorkContext

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            known = {
                r["account_id"]
                for r in await conn.fetch(
                    "SELECT account_id FROM paydb.accounts WHERE account_id = ANY($1::text[])",
                    list({s.account_id for s in specs}),
                )
            }
            existing = {
                r["payout_id"]
                for r in await conn.fetch(
                    "SELECT payout_id FROM paydb.payouts WHERE payout_id = ANY($1::text[])",
                    [s.payout_id for s in specs],
                )
            }
        missing = sorted({s.account_id for s in specs} - known)
        if missing:
            raise CommandError(f"unknown account(s): {', '.join(missing[:5])}; nothing created")
        if existing:
            raise CommandError(
                f"payout(s) already exist: {', '.join(sorted(existing)[:5])}; nothing created"
                " (a PENDING payout without a workflow: `payouts payout start-pending`)"
            )
        store = PayoutStore(pool)
        for s in specs:
            ctx = WorkContext(correlation_id=s.payout_id, actor="payouts-cli")
            await store.create_payout(s.payout_id, s.account_id, s.amount, ctx)
    finally:
        await pool.close()


async def connect_temporal(address: str) -> Any:
    """A Temporal client, or `CommandError(EXIT_UNAVAILABLE)` naming the address."""
    from temporalio.client import Client

    try:
        return await Client.connect(address)
    except RuntimeError as exc:  # the SDK reports a failed connect as RuntimeError
        raise CommandError(
            f"Temporal at {address} is unreachable ({str(exc).splitlines()[0][:120]})",
            EXIT_UNAVAILABLE,
        ) from None


async def start_workflows(
    address: str, queue: str, specs: list[PayoutSpec], client: Any = None, **input_overrides: Any
) -> int:
    """Start the workflow of each payout; returns how many were started now.

    Idempotent, keyed by the workflow id `payout-{id}`: a payout whose workflow already exists
    (running or finished) is skipped, so re-running after a partial failure starts exactly the
    missing ones and never a second workflow for a payout.
    """
    from temporalio.common import (
        SearchAttributePair,
        TypedSearchAttributes,
        WorkflowIDReusePolicy,
    )
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from activities.models import PayoutInput
    from workflows.payout import PayoutWorkflow
    from workflows.search_attributes import PAYOUT_ACCOUNT, PAYOUT_ESCALATED, PAYOUT_STATE

    client = client or await connect_temporal(address)
    sem = asyncio.Semaphore(32)
    started = 0

    async def one(s: PayoutSpec) -> None:
        nonlocal started
        async with sem:
            with contextlib.suppress(WorkflowAlreadyStartedError):  # it exists: keep it
                inp = PayoutInput(
                    payout_id=s.payout_id,
                    account_id=s.account_id,
                    correlation_id=s.payout_id,
                    **input_overrides,
                )
                await client.start_workflow(
                    PayoutWorkflow.run,
                    inp,
                    id=f"payout-{s.payout_id}",
                    task_queue=queue,
                    # A workflow task a frozen worker's long-poll took is retried elsewhere after
                    # this: no longer than the holder heartbeat timeout (10 s, Temporal's own
                    # default, unless a run shortens it), so takeover scales with it (issue 16).
                    task_timeout=timedelta(seconds=min(10.0, inp.holder_heartbeat_timeout_s)),
                    # Findable by state from the start, before its first workflow task runs.
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(PAYOUT_STATE, "PENDING"),
                            SearchAttributePair(PAYOUT_ACCOUNT, s.account_id),
                            SearchAttributePair(PAYOUT_ESCALATED, False),
                        ]
                    ),
                    # One workflow per payout, ever: a second start of the same payout is refused.
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                )
                started += 1

    await asyncio.gather(*(one(s) for s in specs))
    return started


async def pending_payouts(db_url: str) -> list[PayoutSpec]:
    """Every PENDING payout: the ones that may still lack a workflow."""
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT payout_id, account_id, amount FROM paydb.payouts"
            " WHERE state = 'PENDING' ORDER BY created_at"
        )
    finally:
        await conn.close()
    return [PayoutSpec(r["payout_id"], r["account_id"], int(r["amount"])) for r in rows]


def _workflow_error(exc: Exception, payout_id: str) -> CommandError:
    """What a failed signal or query means to the operator, as a one-line error."""
    from temporalio.service import RPCError, RPCStatusCode

    text = str(exc)
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
        if "completed" in text:
            return CommandError(
                f"payout {payout_id}: its workflow has completed; nothing to do", EXIT_CONFLICT
            )
        return CommandError(
            f"unknown payout {payout_id} (no workflow payout-{payout_id})", EXIT_NOT_FOUND
        )
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.UNAVAILABLE:
        return CommandError(f"Temporal is unreachable: {text[:120]}", EXIT_UNAVAILABLE)
    return CommandError(f"payout {payout_id}: {type(exc).__name__}: {text[:160]}", 1)


async def signal_payout(address: str, payout_id: str, name: str, command: OperatorCommand) -> None:
    from temporalio.service import RPCError

    client = await connect_temporal(address)
    handle = client.get_workflow_handle(f"payout-{payout_id}")
    try:
        await handle.signal(name, command)
    except RPCError as exc:
        raise _workflow_error(exc, payout_id) from None


def _operator_token_or_fail() -> str:
    try:  # the lock server authenticates this token; a typed name would prove nothing
        token = operator_token()
    except CredentialsError as exc:
        raise CommandError(str(exc)) from None
    if token is None:
        raise CommandError(
            f"no operator token: set {OPERATOR_TOKEN_FILE_ENV} (`payouts up` prints the line)"
        )
    return token


def operator_assertion(lock_url: str, action: str, payout_id: str, reason: str) -> dict[str, Any]:
    """The lock server's signed operator assertion for `action` on `payout_id`, obtained with the
    operator's token (docs/security.md). Unreachable: EXIT_UNAVAILABLE, and nothing is signalled.
    The assertion holds no secret: it is safe in Temporal history."""
    token = _operator_token_or_fail()
    try:
        r = httpx.post(
            f"{lock_url}/v1/operator-assertions",
            json={"action": action, "payout_id": payout_id, "reason": reason},
            headers=auth_headers(token),
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise CommandError(
            f"lock server at {lock_url} unreachable: {exc}; nothing was sent", EXIT_UNAVAILABLE
        ) from None
    if r.status_code >= 400:
        raise CommandError(
            f"operator assertion refused: HTTP {r.status_code} {r.text[:200]}; nothing was sent"
        )
    body = r.json()
    if not isinstance(body, dict) or not isinstance(body.get("identity"), str):
        raise CommandError(f"lock server at {lock_url} answered no operator assertion")
    return body


async def payout_status(address: str, payout_id: str) -> dict[str, Any]:
    from dataclasses import asdict

    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from workflows.payout import PayoutWorkflow

    client = await connect_temporal(address)
    handle = client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")
    try:
        return asdict(await handle.query(PayoutWorkflow.status))
    except (RPCError, WorkflowQueryFailedError) as exc:
        raise _workflow_error(exc, payout_id) from None


# --------------------------------------------------------------------------- commands


def _require(value: str | None, what: str) -> str:
    if not value or not value.strip():
        raise CommandError(f"--{what} is required and must not be blank")
    return value.strip()


def _cmd_seed(args: argparse.Namespace) -> int:
    if args.accounts <= 0 or args.balance <= 0:
        raise CommandError("--accounts and --balance must be positive")
    created = asyncio.run(
        seed_accounts(
            database_url(args, "PAYDB_DATABASE_URL"), args.accounts, args.balance, args.prefix
        )
    )
    print(f"seeded {len(created)} account(s) {created[0]}..{created[-1]} with {args.balance} each")
    return 0


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
            _spec(
                {
                    "payout_id": args.payout_id or f"po-{uuid.uuid4().hex[:12]}",
                    "account_id": args.account,
                    "amount": args.amount,
                },
                "payout",
            )
        ]
    check_batch(specs)
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
        return 0 if _terminal(counts) == len(specs) else 6
    return 0


def _terminal(counts: dict[str, int]) -> int:
    """How many of the counted payouts are in a terminal state (ledger.states)."""
    return sum(counts.get(str(t), 0) for t in TERMINAL_STATES)


def _progress_line(counts: dict[str, int], total: int, width: int = 30) -> str:
    done = _terminal(counts)
    filled = width * done // max(1, total)
    states = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} terminal  {states}"


async def payout_state_counts(
    db: asyncpg.Connection | asyncpg.Pool, ids: list[str]
) -> Counter[str]:
    """How many of the payouts `ids` are in each state (the one query every follower polls)."""
    rows = await db.fetch(
        "SELECT state, count(*) AS n FROM paydb.payouts WHERE payout_id = ANY($1::text[])"
        " GROUP BY state",
        ids,
    )
    return Counter({r["state"]: int(r["n"]) for r in rows})


async def follow_payouts(db_url: str, payout_ids: list[str], timeout_s: float) -> dict[str, int]:
    """Poll the payouts' states until every one is terminal (or `timeout_s`), drawing a progress
    bar on stderr (redrawn in place on a terminal, one line every 5 s otherwise)."""
    tty = sys.stderr.isatty()
    conn = await asyncpg.connect(db_url)
    counts: dict[str, int] = {}
    try:
        deadline = time.monotonic() + timeout_s
        last_line = 0.0
        while True:
            counts = dict(await payout_state_counts(conn, payout_ids))
            finished = _terminal(counts) == len(payout_ids)
            line = _progress_line(counts, len(payout_ids))
            if tty:
                sys.stderr.write("\r" + line)
            elif finished or time.monotonic() - last_line >= 5:
                sys.stderr.write(line + "\n")
                last_line = time.monotonic()
            sys.stderr.flush()
            if finished or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
    finally:
        await conn.close()
        if tty:
            sys.stderr.write("\n")
    return counts


async def _create_and_start(args: argparse.Namespace, specs: list[PayoutSpec]) -> None:
    """Rows, then workflows, as one recoverable operation: Temporal is reached before any row is
    written, and if starting still fails half-way, `payout start-pending` starts the rest."""
    client = None if args.no_start else await connect_temporal(temporal_address(args))
    await create_payouts(database_url(args, "PAYDB_DATABASE_URL"), specs)
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
    specs = asyncio.run(pending_payouts(database_url(args, "PAYDB_DATABASE_URL")))
    started = asyncio.run(start_workflows(temporal_address(args), task_queue(args), specs))
    print(
        f"{len(specs)} PENDING payout(s): started {started} workflow(s), "
        f"{len(specs) - started} already had one"
    )
    return 0


async def list_payouts(
    address: str, state: str | None, account_id: str | None
) -> list[dict[str, Any]]:
    """Payout workflows by their search attributes (the query the Temporal UI and CLI take)."""
    from workflows.search_attributes import (
        PAYOUT_ACCOUNT,
        PAYOUT_ESCALATED,
        PAYOUT_STATE,
        query,
    )

    client = await connect_temporal(address)
    rows = []
    async for wf in client.list_workflows(query(state, account_id)):
        attrs = wf.typed_search_attributes
        rows.append(
            {
                "workflow_id": wf.id,
                "state": attrs.get(PAYOUT_STATE),
                "account_id": attrs.get(PAYOUT_ACCOUNT),
                "escalated": attrs.get(PAYOUT_ESCALATED),
                "status": wf.status.name if wf.status else None,
            }
        )
    return rows


def _cmd_list(args: argparse.Namespace) -> int:
    from ledger.states import PayoutState

    states = [s.value for s in PayoutState]
    if args.state and args.state not in states:
        raise CommandError(f"--state must be one of {', '.join(states)}")
    if args.account and any(c in args.account for c in '"\\'):
        raise CommandError("--account must not contain quotes or backslashes")
    rows = asyncio.run(list_payouts(temporal_address(args), args.state, args.account))
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        flag = "  escalated" if r["escalated"] else ""
        print(f"{r['workflow_id']}  {r['state']}  account={r['account_id']}  {r['status']}{flag}")
    print(f"{len(rows)} payout(s)")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    status = asyncio.run(payout_status(temporal_address(args), args.payout_id))
    print(json.dumps(status, indent=2, default=str))
    return 0


def _lock_url(args: argparse.Namespace) -> str:
    return str(args.lock_url or os.environ.get("LOCK_URL", "http://127.0.0.1:8701"))


def _cmd_signal(args: argparse.Namespace) -> int:
    from activities.models import OperatorCommand

    reason = _require(args.reason, "reason")
    assertion = operator_assertion(_lock_url(args), args.signal, args.payout_id, reason)
    identity = assertion["identity"]
    command = OperatorCommand(operator=identity, reason=reason, assertion=assertion)
    asyncio.run(signal_payout(temporal_address(args), args.payout_id, args.signal, command))
    print(
        f"sent {args.signal} to payout-{args.payout_id} as {identity} (operator assertion "
        f"valid until {assertion.get('expires_at')}); the workflow and the enforcement points "
        f"check it (see `payouts payout status {args.payout_id}`)"
    )
    return 0


def _cmd_lock_revoke(args: argparse.Namespace) -> int:
    reason = _require(args.reason, "reason")
    url = _lock_url(args)
    key = args.key or lock_key(_require(args.account, "account"))
    token = _operator_token_or_fail()  # the lock server audits the identity it authenticates
    try:
        r = httpx.post(
            f"{url}/v1/locks/revoke",
            json={"key": key, "reason": reason},
            headers=auth_headers(token),
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise CommandError(f"lock server at {url} unreachable: {exc}", EXIT_UNAVAILABLE) from None
    if r.status_code >= 400:
        raise CommandError(f"revoke refused: HTTP {r.status_code} {r.text}")
    print(f"revoked {key}: {r.json()}")
    return 0


def _guard(func: Any) -> Any:
    """One line on stderr and the documented exit code for every expected failure."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except CommandError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.code
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if getattr(args, "debug", False):
                raise
            print(
                f"error: the database could not be used: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return EXIT_UNAVAILABLE

    return run


def common(p: argparse.ArgumentParser, *, db: bool = False, temporal: bool = False) -> None:
    """The connection options a command needs."""
    if db:
        p.add_argument("--database-url", help="defaults to $PAYDB_DATABASE_URL, else $DATABASE_URL")
    if temporal:
        p.add_argument(
            "--temporal",
            help=f"Temporal address (default $TEMPORAL_ADDRESS or {DEFAULT_TEMPORAL})",
        )
        p.add_argument("--task-queue", help=f"default $WORKER_TASK_QUEUE or {DEFAULT_QUEUE}")


def register(sub: Any) -> None:
    seed = sub.add_parser(
        "seed", help="create funded accounts (re-runnable: tops up existing ones)"
    )
    seed.add_argument("--accounts", type=int, default=50, help="how many accounts")
    seed.add_argument("--balance", type=int, default=1_000_000, help="minor units per account")
    seed.add_argument("--prefix", default="acct-", help="account ids are PREFIX00000, ...")
    common(seed, db=True)
    seed.set_defaults(func=_guard(_cmd_seed))
    _register_payout(sub)
    _register_lock(sub)


def _register_payout(sub: Any) -> None:
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
    common(create, db=True, temporal=True)
    create.set_defaults(func=_guard(_cmd_create))

    pending = psub.add_parser(
        "start-pending",
        help="start the workflow of every PENDING payout that has none (idempotent)",
    )
    common(pending, db=True, temporal=True)
    pending.set_defaults(func=_guard(_cmd_start_pending))

    lst = psub.add_parser(
        "list", help="payouts by state (and account), from Temporal's search attributes"
    )
    lst.add_argument("--state", help="PENDING, CLAIMED, ..., RAIL_AMBIGUOUS, POSTED, ...")
    lst.add_argument("--account", help="only this account's payouts")
    lst.add_argument("--json", action="store_true", help="one JSON list instead of lines")
    common(lst, temporal=True)
    lst.set_defaults(func=_guard(_cmd_list))

    status = psub.add_parser("status", help="query a payout workflow's state, token, attempt")
    status.add_argument("payout_id")
    common(status, temporal=True)
    status.set_defaults(func=_guard(_cmd_status))

    for name, help_ in (
        ("abandon", "RAIL_AMBIGUOUS -> ABANDONED, after the SLA escalated"),
        ("revoke", "force-revoke this payout's lock (break-glass)"),
    ):
        p = psub.add_parser(name, help=help_)
        p.add_argument("payout_id")
        p.add_argument(
            "--operator",
            help=f"ignored: the identity of ${OPERATOR_TOKEN_FILE_ENV}, asserted by the lock "
            "server, is audited",
        )
        p.add_argument("--reason", required=True, help="why (audited; e.g. a ticket number)")
        p.add_argument(
            "--lock-url",
            help="the lock server that issues the operator assertion (default $LOCK_URL or "
            "http://127.0.0.1:8701)",
        )
        common(p, temporal=True)
        p.set_defaults(func=_guard(_cmd_signal), signal=name)


def _register_lock(sub: Any) -> None:
    lock = sub.add_parser("lock", help="lock-service operator commands")
    lsub = lock.add_subparsers(dest="lock_command", required=True)
    rev = lsub.add_parser("revoke", help="force-revoke a lock (audited; next token is higher)")
    rev.add_argument("--key", help="lock key, e.g. payout:acct-00001")
    rev.add_argument("--account", help="shorthand for --key payout:ACCOUNT")
    rev.add_argument(
        "--operator", help=f"ignored: the identity of ${OPERATOR_TOKEN_FILE_ENV} is audited"
    )
    rev.add_argument("--reason", required=True, help="why (audited; e.g. a ticket number)")
    rev.add_argument("--lock-url", help="default $LOCK_URL or http://127.0.0.1:8701")
    rev.set_defaults(func=_guard(_cmd_lock_revoke))
