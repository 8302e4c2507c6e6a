"""The fenced write path: the one statement every payout transition goes through (FR-15, FR-16).

Fencing rule: a write presenting token T succeeds only if T >= the stored fence, and stamps
fence = T in the same statement. Equal is accepted because tokens are unique per lock key: an
equal token is the same grant taking its next step (claim, submit, post all present one T).

Every payout mutation is ONE `UPDATE ... WHERE payout_id = $1 AND state = <from> AND fence <= T
RETURNING ...`. When it matches nothing, the row is re-read in the same transaction to classify:
stored fence > T -> `FencedOut` (event `lock.fenced_out`, counter); state already past the expected
from-state -> `AlreadyAdvanced` (not an error); anything else -> `InvalidTransition`.

The account's balance row is fenced too (`_stamp_balance`): the lock protects the account's
payout stream (A-15), so each step stamps both rows under the same T.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from common.lockkey import lock_key
from ledger import metrics
from ledger.audit import write_audit
from ledger.context import WorkContext
from ledger.errors import FencedOut, InvalidTransition, UnknownAccount, UnknownPayout
from ledger.outbox import write_event
from ledger.records import (
    PAYOUT_COLUMNS,
    AlreadyAdvanced,
    Payout,
    check_payout_id,
    check_token,
)
from ledger.states import PayoutState, check_transition, reachable_from
from ledger.store.base import GrantLike, log
from ledger.store.grant_checks import GrantChecks


@asynccontextmanager
async def committed(conn: asyncpg.Connection) -> AsyncIterator[list[dict[str, Any]]]:
    """One transaction; the transitions it recorded are logged and counted after COMMIT only,
    and not at all when it rolls back (events state committed facts, NFR-08)."""
    facts: list[dict[str, Any]] = []
    async with conn.transaction():
        yield facts
    for fact in facts:
        count = fact.pop("_count")
        log.info("payout.transition", **fact)
        if count:
            metrics.TRANSITIONS.labels(
                from_state=fact["from_state"], to_state=fact["to_state"]
            ).inc()


class FencedWrites(GrantChecks):
    """The fenced statement, the classification of a miss, and the balance-row stamp."""

    async def _simple(
        self,
        operation: str,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        grant: GrantLike,
        from_state: PayoutState,
        to_state: PayoutState,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        audit_actor: str | None = None,
        then: tuple[str, PayoutState] | None = None,
        also: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    ) -> Payout | AlreadyAdvanced:
        """A transition of the payout row (plus its audit and outbox rows), fenced on the payout
        row AND on the account's balance row: the lock protects the account's payout stream
        (A-15), so a holder superseded on the account cannot advance any of its payouts, even
        one the new holder has not touched yet (INV-01).

        `then` (operation, state): a second transition from `to_state`, in the SAME database
        transaction and fenced the same way, unless the first found the payout already moved on
        (`mark_submitted_and_acked`). `also`: one more write in the same transaction after the
        transition (not when the payout had moved on); if it raises, the transition rolls back
        (`abandon` ends its operator command with it)."""
        check_payout_id(payout_id)
        check_token(token)
        async with self._pool.acquire() as conn:
            try:
                async with committed(conn) as facts:
                    account_id, _ = await self._granted_account(
                        conn, payout_id, token, grant, operation
                    )
                    await self._stamp_balance(conn, account_id, token, operation, payout_id)
                    result = await self._transition(
                        conn,
                        operation,
                        facts=facts,
                        payout_id=payout_id,
                        token=token,
                        ctx=ctx,
                        from_state=from_state,
                        to_state=to_state,
                        reason=reason,
                        details=details,
                        audit_actor=audit_actor,
                    )
                    if also is not None and not isinstance(result, AlreadyAdvanced):
                        await also(conn)
                    if then is None or isinstance(result, AlreadyAdvanced):
                        return result
                    operation, next_state = then
                    return await self._transition(
                        conn,
                        operation,
                        facts=facts,
                        payout_id=payout_id,
                        token=token,
                        ctx=ctx,
                        from_state=to_state,
                        to_state=next_state,
                    )
            except FencedOut as exc:
                self._report_fenced_out(exc, payout_id, operation)
                raise

    async def _transition(
        self,
        conn: asyncpg.Connection,
        operation: str,
        *,
        facts: list[dict[str, Any]],
        payout_id: str,
        token: int,
        ctx: WorkContext,
        from_state: PayoutState,
        to_state: PayoutState,
        reason: str | None = None,
        group_id: uuid.UUID | None = None,
        details: dict[str, Any] | None = None,
        audit_actor: str | None = None,
        record_metric: bool = True,
    ) -> Payout | AlreadyAdvanced:
        check_transition(from_state, to_state)  # in code, before the database sees anything
        fence_condition = " AND fence <= $4" if self._enforce_fencing else ""
        # The one fenced statement: names the expected from-state (the DB trigger re-checks the
        # edge) and stamps fence = T; a stale token or a moved payout matches zero rows.
        row = await conn.fetchrow(
            "UPDATE paydb.payouts SET state = $3, fence = $4,"
            " failure_reason = COALESCE($5, failure_reason),"
            " ledger_group_id = COALESCE($6, ledger_group_id)"
            f" WHERE payout_id = $1 AND state = $2{fence_condition}"
            f" RETURNING {PAYOUT_COLUMNS}",
            payout_id,
            str(from_state),
            str(to_state),
            token,
            reason,
            group_id,
        )
        if row is None:
            return await self._classify_miss(conn, operation, payout_id, token, from_state)
        payout = Payout.from_row(row)
        await write_audit(
            conn,
            actor=audit_actor or ctx.actor,
            action=operation,
            token=token,
            payout_id=payout_id,
            account_id=payout.account_id,
            from_state=from_state,
            to_state=to_state,
            details={"reason": reason, **(details or {}), "via": ctx.actor},
        )
        await write_event(
            conn,
            event_type=f"payout.{to_state.lower()}",
            ctx=ctx,
            payload={
                "payout_id": payout_id,
                "account_id": payout.account_id,
                "amount": payout.amount,
                "from_state": from_state,
                "to_state": to_state,
                "token": token,
                "client_reference": payout.client_reference,
                "failure_reason": payout.failure_reason,
            },
        )
        # Stated only once COMMIT succeeded (`committed`): a rolled-back posting of a frozen
        # worker must not leave a `payout.transition` to POSTED that never happened.
        facts.append(
            {
                "payout_id": payout_id,
                "account_id": payout.account_id,
                "from_state": str(from_state),
                "to_state": str(to_state),
                "token": token,
                "operation": operation,
                "actor": audit_actor or ctx.actor,
                "correlation_id": ctx.correlation_id,
                "_count": record_metric,
            }
        )
        return payout

    async def _classify_miss(
        self,
        conn: asyncpg.Connection,
        operation: str,
        payout_id: str,
        token: int,
        from_state: PayoutState,
    ) -> AlreadyAdvanced:
        """Why did the fenced update match nothing? Fence first: a stale holder is always told
        it is fenced out, even when the payout has also moved on."""
        row = await conn.fetchrow(
            "SELECT account_id, state, fence FROM paydb.payouts WHERE payout_id = $1 FOR SHARE",
            payout_id,
        )
        if row is None:
            raise UnknownPayout(f"unknown payout {payout_id!r}")
        state = PayoutState(row["state"])
        if self._enforce_fencing and row["fence"] > token:
            raise FencedOut(lock_key(row["account_id"]), token, row["fence"])
        if state in reachable_from(from_state):
            metrics.ALREADY_ADVANCED.labels(operation=operation).inc()
            log.info(
                "payout.already_advanced",
                payout_id=payout_id,
                operation=operation,
                state=str(state),
                token=token,
                stored_token=row["fence"],
            )
            return AlreadyAdvanced(payout_id=payout_id, state=state, fence=row["fence"])
        raise InvalidTransition(
            f"{operation}: payout {payout_id} is {state}, not {from_state} or past it"
        )

    async def _stamp_balance(
        self, conn: asyncpg.Connection, account_id: str, token: int, operation: str, payout_id: str
    ) -> int:
        """Lock the account's balance row and stamp fence = T (FR-15: the balance row is an
        enforcement point too); FencedOut when T is below its fence. Returns the balance."""
        fence_condition = " AND fence <= $2" if self._enforce_fencing else ""
        balance = await conn.fetchval(
            "UPDATE paydb.balances SET fence = $2, updated_at = now()"
            f" WHERE account_id = $1{fence_condition} RETURNING balance",
            account_id,
            token,
        )
        if balance is not None:
            return int(balance)
        stored = await conn.fetchval(
            "SELECT fence FROM paydb.balances WHERE account_id = $1", account_id
        )
        if stored is None:
            raise UnknownAccount(f"unknown account {account_id!r}")
        raise FencedOut(lock_key(account_id), token, int(stored))

    def _report_fenced_out(self, exc: FencedOut, payout_id: str, operation: str) -> None:
        """FR-16: a fenced rejection is a first-class outcome — an event and a counter."""
        log.warning(
            "lock.fenced_out",
            key=exc.key,
            presented_token=exc.presented_token,
            stored_token=exc.stored_token,
            payout_id=payout_id,
            operation=operation,
            enforcement_point="paydb",
        )
        metrics.FENCED_OUT.labels(operation=operation).inc()
