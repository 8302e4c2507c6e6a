"""Reads of the payment database: a balance, a payout, payouts by state or account. No writes."""

from __future__ import annotations

import asyncpg

from ledger.errors import UnknownAccount, UnknownPayout
from ledger.records import PAYOUT_COLUMNS, AuditRow, Payout
from ledger.states import PayoutState

__all__ = ["Reads"]


class Reads:
    """Balances and payouts as committed."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def balance(self, account_id: str) -> int:
        async with self._pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT balance FROM paydb.balances WHERE account_id = $1", account_id
            )
        if value is None:
            raise UnknownAccount(f"unknown account {account_id!r}")
        return int(value)

    async def get_payout(self, payout_id: str) -> Payout:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                f"SELECT {PAYOUT_COLUMNS} FROM paydb.payouts WHERE payout_id = $1", payout_id
            )
        if row is None:
            raise UnknownPayout(f"unknown payout {payout_id!r}")
        return Payout.from_row(row)

    async def list_payouts(
        self,
        *,
        state: PayoutState | str | None = None,
        account_id: str | None = None,
        limit: int = 1000,
        recent_first: bool = False,
    ) -> list[Payout]:
        """Payouts filtered by state and/or account, oldest first (or, `recent_first`, the most
        recently changed first: what an operator's list shows). Unknown state -> UnknownState."""
        state_name = None if state is None else str(PayoutState.parse(state))
        order = "updated_at DESC, payout_id" if recent_first else "created_at, payout_id"
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {PAYOUT_COLUMNS} FROM paydb.payouts"
                " WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR account_id = $2)"
                f" ORDER BY {order} LIMIT $3",
                state_name,
                account_id,
                limit,
            )
        return [Payout.from_row(r) for r in rows]

    async def audit_trail(self, payout_id: str | None = None, limit: int = 200) -> list[AuditRow]:
        """The audit log, oldest first: one payout's rows, or the latest `limit` rows of all."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT * FROM (SELECT audit_id, at, actor, token, action, payout_id, account_id,"
                " from_state, to_state, details::text AS details FROM paydb.audit_log"
                " WHERE ($1::text IS NULL OR payout_id = $1) ORDER BY audit_id DESC LIMIT $2)"
                " latest ORDER BY audit_id",
                payout_id,
                limit,
            )
        return [AuditRow.from_row(r) for r in rows]
