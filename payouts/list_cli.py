"""`payouts payout list`: payouts by state (and account), from the payment database.

Owns: the list an operator reads to find payouts: each payout's state, amount, account and the
time its row last changed, as the payment database holds them at that moment (the record of
truth, docs/payment-database.md). Must never: write anything, or answer from Temporal's
`PayoutState` search attribute, which is the state the workflow last saw and lags the database
while an activity runs (a payout mid-submit is CLAIMED in the database, PENDING in Temporal;
docs/workflow.md, "Search attributes").
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import asyncpg

from payouts.errors import CommandError, guard
from payouts.settings import connection_options, database_url


async def list_payouts(
    url: str, state: str | None, account_id: str | None, limit: int
) -> list[dict[str, Any]]:
    """The payouts in `state` (and of `account_id`), most recently changed first, read through
    the payment store (the one owner of paydb's SQL)."""
    from ledger import PayoutStore

    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    try:
        rows = await PayoutStore(pool).list_payouts(
            state=state, account_id=account_id, limit=limit, recent_first=True
        )
    finally:
        await pool.close()
    return [
        {
            "payout_id": r.payout_id,
            "state": str(r.state),
            "amount": int(r.amount),
            "account_id": r.account_id,
            "updated_at": r.updated_at.isoformat(),
        }
        for r in rows
    ]


def _cmd_list(args: argparse.Namespace) -> int:
    from ledger.states import PayoutState

    states = [s.value for s in PayoutState]
    if args.state and args.state not in states:
        raise CommandError(f"--state must be one of {', '.join(states)}")
    if args.limit <= 0:
        raise CommandError("--limit must be positive")
    url = database_url(args, "PAYDB_DATABASE_URL")
    rows = asyncio.run(list_payouts(url, args.state, args.account, args.limit))
    if args.json:
        print(json.dumps(rows))
        return 0
    if rows:
        print(_table(rows))
    more = " (the most recent; raise --limit for more)" if len(rows) == args.limit else ""
    print(f"{len(rows)} payout(s){more}")
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("PAYOUT", "STATE", "AMOUNT", "ACCOUNT", "UPDATED")
    cells = [header] + [
        (r["payout_id"], r["state"], str(r["amount"]), r["account_id"], r["updated_at"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [
            c.rjust(w) if i == 2 else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def register(psub: Any) -> None:
    """`payouts payout list` under `payouts payout`."""
    lst = psub.add_parser(
        "list",
        help="payouts by state (and account), from the payment database: state, amount, "
        "account, last change",
    )
    lst.add_argument("--state", help="PENDING, CLAIMED, ..., RAIL_AMBIGUOUS, POSTED, ...")
    lst.add_argument("--account", help="only this account's payouts")
    lst.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
    lst.add_argument("--json", action="store_true", help="one JSON list instead of a table")
    connection_options(lst, db=True)
    lst.set_defaults(func=guard(_cmd_list))
