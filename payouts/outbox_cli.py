"""`payouts outbox run|list|retry|discard`: the outbox publisher and its operator commands.

`run` delivers until SIGINT/SIGTERM (settings from OUTBOX_* env). `list` prints the counts by
status and the rows (optionally of one status). `retry` sends dead-lettered or conflict-blocked
rows back to pending with a fresh attempt budget; `discard` marks them discarded (never
deleted). Both need the operator's credential and --reason and write one audit row per event
(FR-30) naming the authenticated operator: the token ($PAYOUTS_OPERATOR_TOKEN_FILE or
$PAYOUTS_OPERATOR_TOKEN) is checked against the operator digests in $OUTBOX_CREDENTIALS_PATH
before anything is read or changed (no server sits in between).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

import asyncpg

from common.credentials import (
    CredentialsError,
    authenticate_operator,
    operator_token,
)
from outbox.delivery import OPERABLE, OutboxError, OutboxSettings, Status
from outbox.ops import list_rows, operator_action, outbox_summary
from outbox.service import load_publisher_settings, run_publisher
from payouts.settings import database_url


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _cmd_run(args: argparse.Namespace) -> int:
    settings = load_publisher_settings()  # refusals first, before anything starts
    # Refuses a DSN that would cross a network unverified (the publisher has no experiment mode).
    return run_publisher(database_url(args, "OUTBOX_DATABASE_URL"), settings)


async def _list(url: str, status: Status | None, limit: int, as_json: bool) -> int:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        summary = await outbox_summary(pool)
        rows = await list_rows(pool, status=status, limit=limit)
    finally:
        await pool.close()
    if as_json:
        _out(json.dumps({"summary": summary, "rows": rows}, default=str, sort_keys=True))
        return 0
    _out(" ".join(f"{k}={v}" for k, v in summary.items()))
    for r in rows:
        _out(
            f"{r['event_id']} {r['status']:<16} attempts={r['attempts']:<3}"
            f" last={r['last_outcome'] or '-'} {r['event_type']} {r['delivery_key']}"
            + (f" error={r['last_error']!r}" if r["last_error"] else "")
        )
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    status = Status(args.status) if args.status else None
    return asyncio.run(
        _list(database_url(args, "OUTBOX_DATABASE_URL"), status, args.limit, args.json)
    )


async def _act(url: str, args: argparse.Namespace, operator: str) -> list[uuid.UUID]:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
    try:
        return await operator_action(
            pool,
            action=args.action,
            event_ids=[uuid.UUID(e) for e in args.event_id] if args.event_id else None,
            status=Status(args.status) if args.status else None,
            operator=operator,
            reason=args.reason,
        )
    finally:
        await pool.close()


def _cmd_act(args: argparse.Namespace) -> int:
    try:  # before anything is read: an unauthenticated command changes nothing
        operator = authenticate_operator(OutboxSettings().credentials_path, operator_token()).name
    except CredentialsError as exc:
        sys.stderr.write(f"error: refused, nothing changed: {exc}\n")
        return 2
    try:
        ids = asyncio.run(_act(database_url(args, "OUTBOX_DATABASE_URL"), args, operator))
    except OutboxError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    verb = "sent back to pending" if args.action == "retry" else "discarded"
    _out(f"{len(ids)} event(s) {verb}: " + " ".join(str(i) for i in ids))
    return 0


def _event_id(text: str) -> str:
    try:
        uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an event id (uuid): {text!r}") from None
    return text


def register(subparsers: Any) -> None:
    outbox = subparsers.add_parser("outbox", help="outbox delivery to the finance ledger")
    sub = outbox.add_subparsers(dest="outbox_command", required=True)

    run = sub.add_parser("run", help="run a publisher until SIGINT/SIGTERM (OUTBOX_* env)")
    run.add_argument("--database-url", help="defaults to $OUTBOX_DATABASE_URL, else $DATABASE_URL")
    run.set_defaults(func=_cmd_run)

    lst = sub.add_parser("list", help="counts by status, and the rows")
    lst.add_argument("--database-url", help="defaults to $OUTBOX_DATABASE_URL, else $DATABASE_URL")
    lst.add_argument("--status", choices=[str(s) for s in Status], help="only rows in this status")
    lst.add_argument("--limit", type=int, default=100, help="at most this many rows")
    lst.add_argument("--json", action="store_true", help="one JSON object: summary and rows")
    lst.set_defaults(func=_cmd_list)

    for action, text in (
        ("retry", "send dead-lettered / conflict-blocked rows back to pending"),
        ("discard", "mark dead-lettered / conflict-blocked rows discarded"),
    ):
        p = sub.add_parser(action, help=text)
        p.add_argument(
            "--database-url", help="defaults to $OUTBOX_DATABASE_URL, else $DATABASE_URL"
        )
        target = p.add_mutually_exclusive_group(required=True)
        target.add_argument("--event-id", action="append", type=_event_id, help="repeatable")
        target.add_argument("--status", choices=[str(s) for s in OPERABLE], help="every such row")
        p.add_argument("--operator", help="ignored: the operator token's identity is audited")
        p.add_argument("--reason", required=True, help="why (audited)")
        p.set_defaults(func=_cmd_act, action=action)
