"""Audit rows (FR-30): every transition, posting, funding and break-glass action, with its actor
and token, written in the same transaction as the change. The table is append-only (trigger)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

#: An audit row's columns, as `write_audit` writes them; a statement that writes the row itself
#: (`ledger.store.fenced`: the transition's one statement) names the same, in this order.
AUDIT_COLUMNS = "actor, token, action, payout_id, account_id, from_state, to_state, details"


def details_json(details: dict[str, Any] | None) -> str:
    """The `details` column's value, encoded as every audit row's is."""
    return json.dumps(details or {}, sort_keys=True, default=str)


async def write_audit(
    conn: asyncpg.Connection,
    *,
    actor: str,
    action: str,
    token: int | None = None,
    payout_id: str | None = None,
    account_id: str | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    if not conn.is_in_transaction():
        raise RuntimeError("audit rows must be written inside the business transaction")
    await conn.execute(
        f"INSERT INTO paydb.audit_log ({AUDIT_COLUMNS})"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)",
        actor,
        token,
        action,
        payout_id,
        account_id,
        from_state,
        to_state,
        details_json(details),
    )
