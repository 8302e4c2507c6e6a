"""The fenced write path: the one statement every payout transition goes through (FR-15, FR-16).

Fencing rule: a write presenting token T succeeds only if T >= the stored fence, and stamps
fence = T in the same statement. Equal is accepted because tokens are unique per lock key: an
equal token is the same grant taking its next step (claim, submit, post all present one T).

`FencedWriter` is the only object of the store that writes a payout's state. Every fenced write
opens `FencedWriter.transaction`, which, in this order and in one database transaction: checks the
grant (`ledger.store.grant_checks`, INV-07) before anything is written (its signature and token
in memory; its key by the first statement's own condition and after it), locks the account's
balance row and stamps its fence = T in that first statement (the lock protects the account's
payout stream, A-15, so each step stamps both rows under the same T), and reports a `FencedOut`
raised anywhere inside as FR-16 asks. Inside it, `FencedTransaction.transition` runs the one
fenced statement: `UPDATE ... WHERE payout_id = $1 AND state = <from> AND fence <= T
RETURNING ...`. When it matches nothing, the row is re-read in the same transaction to
classify: stored fence > T -> `FencedOut` (event `lock.fenced_out`, counter); state already past
the expected from-state -> `AlreadyAdvanced` (not an error); anything else ->
`InvalidTransition`.

`FencedWriter.transition` is that transaction around one transition (optionally a second, and one
more write): what most steps are. A step that writes more (claim's funds check, post's ledger
group) opens the transaction itself and runs its own statements on `FencedTransaction.conn`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from common.lockkey import lock_key
from ledger import metrics
from ledger.audit import AUDIT_COLUMNS, details_json
from ledger.context import WorkContext
from ledger.errors import FencedOut, InvalidTransition, UnknownAccount, UnknownPayout
from ledger.outbox import EVENT_COLUMNS, event_values
from ledger.records import (
    PAYOUT_COLUMNS,
    AlreadyAdvanced,
    Payout,
    check_payout_id,
    check_token,
)
from ledger.states import PayoutState, check_transition, reachable_from
from ledger.store.base import GrantLike, log
from ledger.store.grant_checks import GrantCheck, Presented
from lockservice.verifiers import GrantVerifier

__all__ = ["FencedTransaction", "FencedWriter"]


#: A payout transition, its audit row and its outbox event in ONE statement: the fenced update
#: ($1-$6, `{fence}` its fence condition), the audit row ($7 actor, $8 action, $9 details) and
#: the event ($10-$17, `ledger.outbox.event_values`; the payload's row fields added here) are
#: written only for the row the update matched (the same facts `write_audit` and `write_event`
#: write; tests/ledger/test_transition_statement.py compares them). The outbox's statement
#: trigger notifies even when nothing matched: at most a spare wake-up of the publisher.
_TRANSITION = (
    "WITH moved AS ("
    " UPDATE paydb.payouts SET state = $3, fence = $4,"
    " failure_reason = COALESCE($5, failure_reason),"
    " ledger_group_id = COALESCE($6, ledger_group_id)"
    " WHERE payout_id = $1 AND state = $2{fence}"
    f" RETURNING {PAYOUT_COLUMNS}"
    "), audited AS ("
    f" INSERT INTO paydb.audit_log ({AUDIT_COLUMNS})"
    " SELECT $7::text, $4, $8::text, payout_id, account_id, $2, $3, $9::jsonb FROM moved"
    "), staged AS ("
    f" INSERT INTO paydb.outbox ({EVENT_COLUMNS})"
    " SELECT $10::uuid, $11::text, $12::text, $13::text, $14::text,"
    " $15::jsonb || jsonb_build_object('account_id', account_id, 'amount', amount,"
    " 'client_reference', client_reference, 'failure_reason', failure_reason),"
    " $16::text, $17::text FROM moved"
    f") SELECT {PAYOUT_COLUMNS} FROM moved"
)
_TRANSITION_FENCED = _TRANSITION.format(fence=" AND fence <= $4")
#: Fencing off (FR-29, the UC-03 negative control only): no fence condition.
_TRANSITION_UNFENCED = _TRANSITION.format(fence="")


#: A fenced transaction's first statement (issue 29: one round trip where the payout's account
#: was read, then its balance row stamped): the payout's account and amount ($1), and its balance
#: row locked and stamped fence = T ($2, `{fence}` the fence condition), only when the caller may
#: stamp at all ($4, `Presented.may_stamp`) and only for the account the grant's key names ($3;
#: NULL for a trusted caller). Money: a grant of another account's key, or an expired one, stamps
#: nothing here and is refused next (`GrantCheck.check_account`), before any other write.
#: `balance` is NULL when nothing was stamped; the updated row's own value otherwise (read after
#: its row lock, as the standalone UPDATE did).
_OPEN = (
    "WITH payout AS (SELECT account_id, amount FROM paydb.payouts WHERE payout_id = $1),"
    " stamped AS ("
    " UPDATE paydb.balances b SET fence = $2, updated_at = now() FROM payout p"
    " WHERE $4 AND b.account_id = p.account_id AND ($3::text IS NULL OR p.account_id = $3){fence}"
    " RETURNING b.balance"
    ") SELECT p.account_id, p.amount, (SELECT balance FROM stamped) AS balance FROM payout p"
)
_OPEN_FENCED = _OPEN.format(fence=" AND b.fence <= $2")
#: Fencing off (FR-29, the UC-03 negative control only): no fence condition.
_OPEN_UNFENCED = _OPEN.format(fence="")


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


class FencedWriter:
    """The fencing switch, the grant check, the balance-row stamp, and the fenced transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        enforce_fencing: bool = True,
        verifier: GrantVerifier | None = None,
    ) -> None:
        self._pool = pool
        # FR-29: the experiment switch. Off, the fence condition is dropped from every statement
        # and a stale holder CAN move money: only ever for the UC-03 negative control.
        self._enforce_fencing = enforce_fencing
        self._grants = GrantCheck(verifier, enforce_fencing=enforce_fencing)
        if not enforce_fencing:
            log.warning(
                "fencing.disabled",
                enforcement_point="paydb",
                detail="the fence condition is removed from every write: experiment only",
            )

    @property
    def enforce_fencing(self) -> bool:
        return self._enforce_fencing

    @asynccontextmanager
    async def transaction(
        self, operation: str, payout_id: str, token: int, grant: GrantLike
    ) -> AsyncIterator[FencedTransaction]:
        """One database transaction of a fenced write, opened with its grant checked (before any
        write, INV-07) and the account's balance row locked and stamped fence = T (FencedOut when
        T is below it). A `FencedOut` raised inside is reported (FR-16) after the rollback.

        Fenced on the balance row as well as on the payout row: a holder superseded on the
        account cannot advance any of its payouts, even one the new holder has not touched yet
        (INV-01). Transitions are logged and counted only once COMMIT succeeded (`committed`)."""
        check_payout_id(payout_id)
        check_token(token)
        presented = self._grants.presented(payout_id, token, grant, operation)
        async with self._pool.acquire() as conn:
            try:
                async with committed(conn) as facts:
                    account_id, amount, balance = await self._open(
                        conn, presented, payout_id, token, operation
                    )
                    yield FencedTransaction(
                        conn,
                        facts,
                        payout_id=payout_id,
                        token=token,
                        account_id=account_id,
                        amount=amount,
                        balance=balance,
                        enforce_fencing=self._enforce_fencing,
                    )
            except FencedOut as exc:
                self._report_fenced_out(exc, payout_id, operation)
                raise

    async def transition(
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
        """A transition of the payout row (plus its audit and outbox rows) in its own fenced
        transaction (`transaction`: grant checked, balance row stamped first).

        `then` (operation, state): a second transition from `to_state`, in the SAME database
        transaction and fenced the same way, unless the first found the payout already moved on
        (`mark_submitted_and_acked`). `also`: one more write in the same transaction after the
        transition (not when the payout had moved on); if it raises, the transition rolls back
        (`abandon` ends its operator command with it)."""
        async with self.transaction(operation, payout_id, token, grant) as tx:
            result = await tx.transition(
                operation,
                ctx,
                from_state=from_state,
                to_state=to_state,
                reason=reason,
                details=details,
                audit_actor=audit_actor,
            )
            if also is not None and not isinstance(result, AlreadyAdvanced):
                await also(tx.conn)
            if then is None or isinstance(result, AlreadyAdvanced):
                return result
            next_operation, next_state = then
            return await tx.transition(
                next_operation, ctx, from_state=to_state, to_state=next_state
            )

    async def _open(
        self,
        conn: asyncpg.Connection,
        presented: Presented,
        payout_id: str,
        token: int,
        operation: str,
    ) -> tuple[str, int, int]:
        """The transaction's first statement (`_OPEN`): the payout's account and amount, and its
        balance row locked and stamped fence = T (FR-15: the balance row is an enforcement point
        too), then the grant's account and expiry checked (`GrantCheck.check_account`: nothing
        was stamped unless it passes); FencedOut when T is below the fence. Returns the account,
        the amount and the balance."""
        row = await conn.fetchrow(
            _OPEN_FENCED if self._enforce_fencing else _OPEN_UNFENCED,
            payout_id,
            token,
            presented.account,
            presented.may_stamp,
        )
        if row is None:
            raise UnknownPayout(f"unknown payout {payout_id!r}")
        account_id, amount = row["account_id"], int(row["amount"])
        await self._grants.check_account(
            conn, presented, account_id, payout_id=payout_id, token=token, operation=operation
        )
        if row["balance"] is not None:
            return account_id, amount, int(row["balance"])
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


class FencedTransaction:
    """One open fenced transaction of one payout under one token, made only by
    `FencedWriter.transaction`: its grant is checked and its account's balance row is locked and
    stamped. `conn` is for the step's own statements in the same transaction."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        facts: list[dict[str, Any]],
        *,
        payout_id: str,
        token: int,
        account_id: str,
        amount: int,
        balance: int,
        enforce_fencing: bool,
    ) -> None:
        self.conn = conn
        self.payout_id = payout_id
        self.token = token
        #: The payout's account and amount, as read before the grant check.
        self.account_id = account_id
        self.amount = amount
        #: The account's balance, read from its row as it was locked and stamped.
        self.balance = balance
        self._facts = facts
        self._enforce_fencing = enforce_fencing

    async def transition(
        self,
        operation: str,
        ctx: WorkContext,
        *,
        from_state: PayoutState,
        to_state: PayoutState,
        reason: str | None = None,
        group_id: uuid.UUID | None = None,
        details: dict[str, Any] | None = None,
        audit_actor: str | None = None,
        record_metric: bool = True,
    ) -> Payout | AlreadyAdvanced:
        """The one fenced statement of a payout transition, with its audit and outbox rows."""
        payout_id, token = self.payout_id, self.token
        check_transition(from_state, to_state)  # in code, before the database sees anything
        actor = audit_actor or ctx.actor
        # The payload's fields known before the statement; the row's own (account, amount,
        # client reference, failure reason) are added by the statement from the updated row.
        event = event_values(
            event_type=f"payout.{to_state.lower()}",
            ctx=ctx,
            payload={
                "payout_id": payout_id,
                "from_state": from_state,
                "to_state": to_state,
                "token": token,
            },
        )
        # The one fenced statement: names the expected from-state (the DB trigger re-checks the
        # edge) and stamps fence = T; a stale token or a moved payout matches zero rows, and then
        # its audit and outbox rows are not written either (they select from the update's
        # RETURNING). One round trip instead of three (issue 29).
        row = await self.conn.fetchrow(
            _TRANSITION_FENCED if self._enforce_fencing else _TRANSITION_UNFENCED,
            payout_id,
            str(from_state),
            str(to_state),
            token,
            reason,
            group_id,
            actor,
            operation,
            details_json({"reason": reason, **(details or {}), "via": ctx.actor}),
            *event,
        )
        if row is None:
            return await self._classify_miss(operation, from_state)
        payout = Payout.from_row(row)
        # Stated only once COMMIT succeeded (`committed`): a rolled-back posting of a frozen
        # worker must not leave a `payout.transition` to POSTED that never happened.
        self._facts.append(
            {
                "payout_id": payout_id,
                "account_id": payout.account_id,
                "from_state": str(from_state),
                "to_state": str(to_state),
                "token": token,
                "operation": operation,
                "actor": actor,
                "correlation_id": ctx.correlation_id,
                "_count": record_metric,
            }
        )
        return payout

    async def _classify_miss(self, operation: str, from_state: PayoutState) -> AlreadyAdvanced:
        """Why did the fenced update match nothing? Fence first: a stale holder is always told
        it is fenced out, even when the payout has also moved on."""
        payout_id, token = self.payout_id, self.token
        row = await self.conn.fetchrow(
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
