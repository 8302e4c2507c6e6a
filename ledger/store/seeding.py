"""Accounts, funding and new payouts: the writes that come before any lock (not fenced).

Funding only adds money and a new payout is PENDING: neither is part of an account's fenced
payout stream; the balance row lock serialises funding with claims and postings.
"""

from __future__ import annotations

import uuid

import asyncpg

from ledger import metrics
from ledger.audit import write_audit
from ledger.context import WorkContext
from ledger.errors import DuplicateAccount, DuplicatePayout, InvalidAmount
from ledger.journal import FUNDING_SOURCE, write_group
from ledger.outbox import write_event
from ledger.records import (
    PAYOUT_COLUMNS,
    Payout,
    check_account_id,
    check_amount,
    check_payout_id,
)
from ledger.store.base import S, customer_account

__all__ = ["Seeding"]


class Seeding:
    """Open and fund customer accounts; create PENDING payouts."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create_account(self, account_id: str, ctx: WorkContext) -> None:
        """Open a customer account with a zero balance and fence 0."""
        check_account_id(account_id)
        async with self._pool.acquire() as conn, conn.transaction():
            try:
                await conn.execute(
                    "INSERT INTO paydb.accounts (account_id, kind) VALUES ($1, 'customer')",
                    account_id,
                )
            except asyncpg.UniqueViolationError:
                raise DuplicateAccount(f"account {account_id} already exists") from None
            await conn.execute("INSERT INTO paydb.balances (account_id) VALUES ($1)", account_id)
            await write_audit(conn, actor=ctx.actor, action="account.opened", account_id=account_id)
            await write_event(
                conn, event_type="account.opened", ctx=ctx, payload={"account_id": account_id}
            )

    async def fund_account(self, account_id: str, amount: int, ctx: WorkContext) -> uuid.UUID:
        """Credit a customer account from `funding_source`: a balanced group of its own.

        Not fenced: funding only adds money and is not part of an account's payout stream; the
        balance row lock serialises it with claims and postings.
        """
        check_account_id(account_id)
        check_amount(amount)
        group_id = uuid.uuid4()
        correlation_id = f"{account_id}:funding:{group_id}"
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await customer_account(conn, account_id)
                await write_group(
                    conn,
                    group_id=group_id,
                    kind="funding",
                    correlation_id=correlation_id,
                    entries=[(account_id, amount), (FUNDING_SOURCE, -amount)],
                )
                details = {"group_id": str(group_id), "amount": amount}
                await write_audit(
                    conn,
                    actor=ctx.actor,
                    action="account.funded",
                    account_id=account_id,
                    details=details,
                )
                await write_event(
                    conn,
                    event_type="ledger.posted",
                    ctx=ctx,
                    correlation_id=correlation_id,
                    payload={"kind": "funding", "account_id": account_id, **details},
                )
        except asyncpg.NumericValueOutOfRangeError:
            raise InvalidAmount(f"funding {amount} would overflow a balance") from None
        metrics.LEDGER_GROUPS.labels(kind="funding").inc()
        return group_id

    async def create_payout(
        self, payout_id: str, account_id: str, amount: int, ctx: WorkContext
    ) -> Payout:
        """A PENDING payout; its client reference (what the rail sees) is its id, forever."""
        check_payout_id(payout_id)
        check_account_id(account_id)
        check_amount(amount)
        async with self._pool.acquire() as conn, conn.transaction():
            await customer_account(conn, account_id)
            try:
                row = await conn.fetchrow(
                    "INSERT INTO paydb.payouts (payout_id, account_id, amount, client_reference)"
                    f" VALUES ($1, $2, $3, $1) RETURNING {PAYOUT_COLUMNS}",
                    payout_id,
                    account_id,
                    amount,
                )
            except asyncpg.UniqueViolationError:
                raise DuplicatePayout(f"payout {payout_id} already exists") from None
            payout = Payout.from_row(row)
            payload = {"payout_id": payout_id, "account_id": account_id, "amount": amount}
            await write_audit(
                conn,
                actor=ctx.actor,
                action="payout.created",
                payout_id=payout_id,
                account_id=account_id,
                to_state=S.PENDING,
                details=payload,
            )
            await write_event(conn, event_type="payout.created", ctx=ctx, payload=payload)
        return payout
