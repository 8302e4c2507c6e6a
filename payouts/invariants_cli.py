"""`payouts check-invariants` (issues 7 and 12, NFR-06/NFR-07): INV-01..INV-10 over the whole
system. INV-10 asks Temporal (`--temporal`, default $TEMPORAL_ADDRESS as for every command) about
payout workflows that closed without completing, and applies its "terminal or escalated" rule only
with `--settled` (mid-run, payouts are legitimately in between).

Prints each invariant with its count of violations and a bounded sample (or one JSON object with
`--json`). Exit status 0 when every count is zero, 1 on any violation, 2 when a source could not be
read (like diff(1)). It never writes to any database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import asyncpg

from common.credentials import CredentialsError
from common.exiting import load_settings
from common.logs import configure_logging
from invariants.checker import (
    GrantSource,
    HoldSource,
    InvariantError,
    InvariantReport,
    InvariantSettings,
    WorkflowSource,
    check_invariants,
    history_kinds,
    lock_server_grant_source,
    lock_server_hold_source,
    merged_grant_source,
    postgres_grant_source,
    postgres_hold_source,
    stub_movement_source,
    temporal_workflow_source,
)
from payouts.settings import DEFAULT_TEMPORAL, database_url, temporal_address


def _out(line: str) -> None:
    """Command output goes to stdout (events go to stderr), so `--json` output stays parseable."""
    sys.stdout.write(line + "\n")


def grant_source(args: argparse.Namespace, settings: InvariantSettings, db_url: str) -> GrantSource:
    """The history of each backend named (`postgres`, `http`, or both merged)."""
    sources = [
        lock_server_grant_source(args.lock_url or settings.lock_url, token=settings.token())
        if kind == "http"
        else postgres_grant_source(
            settings.lock_database_url or db_url, backend_prefix=settings.lock_prefix
        )
        for kind in history_kinds(args.history or settings.history)
    ]
    return sources[0] if len(sources) == 1 else merged_grant_source(sources)


def hold_source(args: argparse.Namespace, settings: InvariantSettings, db_url: str) -> HoldSource:
    """The locks held now (INV-10's blocked accounts): from the lock server when the history
    names it (it answers for the backend it runs on now, also after a switch), else PostgreSQL."""
    if "http" in history_kinds(args.history or settings.history):
        return lock_server_hold_source(args.lock_url or settings.lock_url, token=settings.token())
    return postgres_hold_source(
        settings.lock_database_url or db_url, backend_prefix=settings.lock_prefix
    )


def workflow_source(args: argparse.Namespace) -> WorkflowSource | None:
    return None if args.no_workflows else temporal_workflow_source(temporal_address(args))


async def _run(args: argparse.Namespace, settings: InvariantSettings) -> InvariantReport:
    url = database_url(args, "CHECKER_DATABASE_URL")
    grants = grant_source(args, settings, url)
    conn = await asyncpg.connect(url)
    try:
        return await check_invariants(
            conn,
            stub_movement_source(
                args.rail_admin_url or settings.rail_admin_url, token=settings.token()
            ),
            grants,
            workflow_source=workflow_source(args),
            settled=args.settled,
            sample_size=settings.sample_size,
            hold_source=hold_source(args, settings, url),
            hold_bound_s=settings.hold_bound_s,
        )
    finally:
        await conn.close()


def _cmd_check(args: argparse.Namespace) -> int:
    settings = load_settings("check-invariants", InvariantSettings)
    try:  # before connecting: a token file that cannot be read is one line, nothing started
        settings.token()
    except CredentialsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    configure_logging("invariants")
    try:
        report = asyncio.run(_run(args, settings))
    except (InvariantError, OSError, asyncpg.PostgresError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.json:
        _out(json.dumps(report.as_dict(), sort_keys=True))
    else:
        for r in report.results:
            sample = "; ".join(r.sample)
            _out(
                f"{r.invariant} {r.title:<62} {r.count:>6}" + (f"  e.g. {sample}" if sample else "")
            )
        checked = ", ".join(f"{k} {v}" for k, v in report.checked.items())
        _out(f"checked: {checked}")
        for rule in report.not_checked:
            _out(f"not checked: {rule}")
        _out("OK: all invariants hold" if report.ok else "VIOLATIONS FOUND")
    return 0 if report.ok else 1


def _history(value: str) -> str:
    try:
        history_kinds(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def register(subparsers: Any) -> None:
    """Add `payouts check-invariants`."""
    p = subparsers.add_parser(
        "check-invariants", help="check INV-01..INV-10 read-only (exit 0 clean, 1 violations)"
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--database-url", help="defaults to $CHECKER_DATABASE_URL, else $DATABASE_URL")
    p.add_argument("--rail-admin-url", help="defaults to $INVARIANTS_RAIL_ADMIN_URL")
    p.add_argument("--lock-url", help="lock server, for --history http ($INVARIANTS_LOCK_URL)")
    p.add_argument(
        "--history",
        type=_history,
        help="where the grant history is read: postgres, http, or postgres,http for a lock "
        "server that has run on both backends ($INVARIANTS_HISTORY, default postgres)",
    )
    p.add_argument(
        "--temporal",
        help=f"Temporal address for INV-10 (default $TEMPORAL_ADDRESS or {DEFAULT_TEMPORAL})",
    )
    p.add_argument(
        "--no-workflows",
        action="store_true",
        help="do not ask Temporal: INV-10's closed-workflow rule is reported as not checked",
    )
    p.add_argument(
        "--settled",
        action="store_true",
        help="the system has settled: every payout must be terminal or escalated (INV-10)",
    )
    p.set_defaults(func=_cmd_check)
