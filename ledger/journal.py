"""Writing one balanced ledger group and the balances it moves, inside the caller's transaction.

The database refuses to commit a group whose entries do not sum to zero (deferred constraint
trigger); this module also checks it first so that a programming error fails before any SQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Literal

import asyncpg

RAIL_CLEARING = "rail_clearing"
FUNDING_SOURCE = "funding_source"
SYSTEM_ACCOUNTS = frozenset({RAIL_CLEARING, FUNDING_SOURCE})


async def write_group(
    conn: asyncpg.Connection,
    *,
    group_id: uuid.UUID,
    kind: Literal["funding", "payout"],
    correlation_id: str,
    entries: Sequence[tuple[str, int]],
    payout_id: str | None = None,
    token: int | None = None,
) -> None:
    """Insert the group, its entries, and add each entry to its account's balance row.

    Entries must be ordered customer account first, system accounts after: every writer locks
    balance rows in that order, so two transactions never wait on each other in a cycle.
    """
    if not conn.is_in_transaction():
        raise RuntimeError("a ledger group must be written inside one transaction")
    if sum(amount for _, amount in entries) != 0 or len(entries) < 2:
        raise ValueError(f"unbalanced ledger group {entries!r}")
    # ledger_groups.payout_id is UNIQUE: a second posting of one payout cannot commit, even if
    # the state machine and the fence had both been bypassed.
    await conn.execute(
        "INSERT INTO paydb.ledger_groups (group_id, kind, payout_id, correlation_id, token)"
        " VALUES ($1, $2, $3, $4, $5)",
        group_id,
        kind,
        payout_id,
        correlation_id,
        token,
    )
    for account_id, amount in entries:
        await conn.execute(
            "INSERT INTO paydb.ledger_entries (group_id, account_id, amount) VALUES ($1, $2, $3)",
            group_id,
            account_id,
            amount,
        )
        # Same transaction as the entry: balance = Σ entries holds at every commit (INV-03).
        await conn.execute(
            "UPDATE paydb.balances SET balance = balance + $2, updated_at = now()"
            " WHERE account_id = $1",
            account_id,
            amount,
        )
