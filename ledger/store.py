"""The fenced payout store over an asyncpg pool: the first fencing enforcement point (FR-15).

Fencing rule: a write presenting token T succeeds only if T >= the stored fence, and stamps
fence = T in the same statement. Equal is accepted because tokens are unique per lock key: an
equal token is the same grant taking its next step (claim, submit, post all present one T).

Every payout mutation is ONE `UPDATE ... WHERE payout_id = $1 AND state = <from> AND fence <= T
RETURNING ...`. When it matches nothing, the row is re-read in the same transaction to classify:
stored fence > T -> `FencedOut` (event `lock.fenced_out`, counter); state already past the expected
from-state -> `AlreadyAdvanced` (not an error); anything else -> `InvalidTransition`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from ledger import metrics
from ledger.audit import write_audit
from ledger.context import WorkContext
from ledger.errors import (
    DuplicateAccount,
    DuplicatePayout,
    FencedOut,
    InvalidAmount,
    InvalidGrant,
    InvalidIdentifier,
    InvalidOperatorAssertion,
    InvalidTransition,
    UnknownAccount,
    UnknownPayout,
)
from ledger.journal import FUNDING_SOURCE, RAIL_CLEARING, SYSTEM_ACCOUNTS, write_group
from ledger.outbox import PAYOUT_EVENTS, write_event
from ledger.records import (
    PAYOUT_COLUMNS,
    AlreadyAdvanced,
    Payout,
    check_account_id,
    check_amount,
    check_payout_id,
    check_text,
    check_token,
    lock_key,
)
from ledger.states import IN_FLIGHT_STATES, PayoutState, check_transition, reachable_from
from lockservice.assertions import AssertionRefused, AssertionVerifier
from lockservice.grants import GrantError, GrantExpired, GrantVerifier, SignedGrant, is_expired
from payouts.logs import get_logger

__all__ = ["AlreadyAdvanced", "Payout", "PayoutStore", "lock_key"]

S = PayoutState
#: What a fenced write may present: the signed grant (or its wire form); None = no grant.
GrantLike = SignedGrant | Mapping[str, Any] | None
log = get_logger("ledger.store")
INSUFFICIENT_FUNDS = "insufficient_funds"


@asynccontextmanager
async def _committed(conn: asyncpg.Connection) -> AsyncIterator[list[dict[str, Any]]]:
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


class PayoutStore:
    """Accounts, funding, payouts and their fenced transitions, postings, and reads."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        enforce_fencing: bool = True,
        verifier: GrantVerifier | None = None,
        verify_assertions: bool = True,
    ) -> None:
        self._pool = pool
        # Break-glass commands sent as Temporal signals (abandon) are authenticated by the lock
        # service's operator assertion, checked with the same public keys as grants. Off
        # (`verify_assertions=False`, an experiment switch) or without a verifier (a trusted
        # caller), the signal's free-text operator name is audited as given.
        self._assertions = (
            AssertionVerifier.of(verifier) if verifier is not None and verify_assertions else None
        )
        # INV-07: with a verifier, every fenced write needs the lock service's signed grant for
        # the payout's account and the presented token. The worker always passes one; None is
        # for tests and tools that write as a trusted caller (docs/payment-database.md).
        self._verifier = verifier
        # FR-29: the experiment switch. Off, the fence condition is dropped from every statement
        # and a stale holder CAN move money: only ever for the UC-03 negative control.
        self._enforce_fencing = enforce_fencing
        if not enforce_fencing:
            log.warning(
                "fencing.disabled",
                enforcement_point="paydb",
                detail="the fence condition is removed from every write: experiment only",
            )

    @property
    def enforce_fencing(self) -> bool:
        return self._enforce_fencing

    # ------------------------------------------------------------------ accounts and funding

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
                await self._customer_account(conn, account_id)
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

    async def balance(self, account_id: str) -> int:
        async with self._pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT balance FROM paydb.balances WHERE account_id = $1", account_id
            )
        if value is None:
            raise UnknownAccount(f"unknown account {account_id!r}")
        return int(value)

    # ------------------------------------------------------------------ payouts: create and read

    async def create_payout(
        self, payout_id: str, account_id: str, amount: int, ctx: WorkContext
    ) -> Payout:
        """A PENDING payout; its client reference (what the rail sees) is its id, forever."""
        check_payout_id(payout_id)
        check_account_id(account_id)
        check_amount(amount)
        async with self._pool.acquire() as conn, conn.transaction():
            await self._customer_account(conn, account_id)
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
        return payout

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
    ) -> list[Payout]:
        """Payouts filtered by state and/or account, oldest first. Unknown state -> UnknownState."""
        state_name = None if state is None else str(PayoutState.parse(state))
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {PAYOUT_COLUMNS} FROM paydb.payouts"
                " WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR account_id = $2)"
                " ORDER BY created_at, payout_id LIMIT $3",
                state_name,
                account_id,
                limit,
            )
        return [Payout.from_row(r) for r in rows]

    # ------------------------------------------------------------------ fenced transitions

    async def claim(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """PENDING -> CLAIMED, or PENDING -> FAILED(insufficient_funds) (UC-01 step 4, A-09).

        One transaction: the account's balance row is locked and fence-stamped, available funds
        = balance - amounts of this account's in-flight payouts, then the fenced payout update.
        """
        check_payout_id(payout_id)
        check_token(token)
        operation = "claim"
        async with self._pool.acquire() as conn:
            try:
                async with _committed(conn) as facts:
                    account_id, amount = await self._granted_account(
                        conn, payout_id, token, grant, operation
                    )
                    balance = await self._stamp_balance(
                        conn, account_id, token, operation, payout_id
                    )
                    in_flight = await conn.fetchval(
                        "SELECT COALESCE(SUM(amount), 0) FROM paydb.payouts"
                        " WHERE account_id = $1 AND state = ANY($2::text[]) AND payout_id <> $3",
                        account_id,
                        [str(s) for s in IN_FLIGHT_STATES],
                        payout_id,
                    )
                    available = balance - int(in_flight)
                    details = {"available": available, "amount": amount}
                    funded = available >= amount
                    return await self._transition(
                        conn,
                        operation,
                        facts=facts,
                        payout_id=payout_id,
                        token=token,
                        ctx=ctx,
                        from_state=S.PENDING,
                        to_state=S.CLAIMED if funded else S.FAILED,
                        reason=None if funded else INSUFFICIENT_FUNDS,
                        details=details,
                    )
            except FencedOut as exc:
                self._report_fenced_out(exc, payout_id, operation)
                raise

    async def stamp_account_fence(
        self, payout_id: str, token: int, *, grant: GrantLike = None
    ) -> None:
        """Raise the fence of the payout's account's balance row to T, whatever state the payout
        is in (T >= fence: stamp T; lower: `FencedOut`). No payout row changes.

        Why: the claim step of a newer holder finds the payout CLAIMED, RAIL_SUBMITTED, ... when
        it only recovers or posts, and `claim` (PENDING only) would then write nothing. Without
        this stamp the account's fence stays at the older holder's token, and that holder, thawed
        from a pause, could still advance the account's payouts at the payment database until
        the newer one happened to write (INV-01). The stamp fences it out at once.
        """
        check_payout_id(payout_id)
        check_token(token)
        operation = "stamp_account_fence"
        async with self._pool.acquire() as conn:
            try:
                async with conn.transaction():
                    account_id, _ = await self._granted_account(
                        conn, payout_id, token, grant, operation
                    )
                    await self._stamp_balance(conn, account_id, token, operation, payout_id)
            except FencedOut as exc:
                self._report_fenced_out(exc, payout_id, operation)
                raise

    async def mark_submitted(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED: the proxy has durably recorded the attempt."""
        return await self._simple(
            "mark_submitted",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.CLAIMED,
            to_state=S.RAIL_SUBMITTED,
        )

    async def mark_acked(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> RAIL_ACKED: the rail acknowledged."""
        return await self._simple(
            "mark_acked",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_SUBMITTED,
            to_state=S.RAIL_ACKED,
        )

    async def mark_declined(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str,
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> FAILED: a business decline; no ledger movement."""
        check_text(reason, "reason")
        return await self._simple(
            "mark_declined",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_SUBMITTED,
            to_state=S.FAILED,
            reason=reason,
        )

    async def mark_ambiguous(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str = "indeterminate",
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> RAIL_AMBIGUOUS: money may have moved; never submitted again."""
        check_text(reason, "reason")
        return await self._simple(
            "mark_ambiguous",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_SUBMITTED,
            to_state=S.RAIL_AMBIGUOUS,
            details={"reason": reason},
        )

    async def resolve_settled(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> RAIL_ACKED: a lookup by client reference found it settled."""
        return await self._simple(
            "resolve_settled",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.RAIL_ACKED,
        )

    async def resolve_absent(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str = "absent_at_rail",
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> FAILED: a lookup says the rail definitively never had it."""
        check_text(reason, "reason")
        return await self._simple(
            "resolve_absent",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.FAILED,
            reason=reason,
        )

    async def abandon(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        operator: str,
        reason: str,
        grant: GrantLike = None,
        assertion: Mapping[str, Any] | None = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> ABANDONED: break-glass, by an operator with identity and reason.

        Still fenced: the operator's command reaches the database through the workflow that
        holds the account's grant, so a stale holder cannot abandon under an old token. With
        assertion verification on, `assertion` must be the lock service's operator assertion
        for `abandon` of this payout, unexpired by this process's clock; the identity and reason
        inside it are audited (InvalidOperatorAssertion otherwise, before anything is written).
        """
        if self._assertions is not None:
            try:
                a = self._assertions.verify(assertion, action="abandon", payout_id=payout_id)
            except AssertionRefused as exc:
                raise InvalidOperatorAssertion(str(exc), reason=exc.code) from None
            operator, reason = a.identity, a.reason
        check_text(operator, "operator")
        check_text(reason, "reason")
        return await self._simple(
            "abandon",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.ABANDONED,
            reason=f"abandoned: {reason}",
            details={"operator": operator, "reason": reason},
            audit_actor=operator,
        )

    async def post(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_ACKED -> POSTED with the ledger and balance, in ONE transaction (UC-01 step 8).

        Money cannot be debited twice: the RAIL_ACKED -> POSTED update matches a row at most
        once (row lock + state condition), the ledger group is only written when it matched, and
        ledger_groups.payout_id is UNIQUE as a last line.
        """
        check_payout_id(payout_id)
        check_token(token)
        operation = "post"
        group_id = uuid.uuid4()
        async with self._pool.acquire() as conn:
            try:
                async with _committed(conn) as facts:
                    account_id, amount = await self._granted_account(
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
                        from_state=S.RAIL_ACKED,
                        to_state=S.POSTED,
                        group_id=group_id,
                        details={"group_id": str(group_id), "amount": amount},
                        record_metric=False,
                    )
                    if isinstance(result, AlreadyAdvanced):
                        return result
                    correlation_id = f"{account_id}:{payout_id}:{group_id}"
                    await write_group(
                        conn,
                        group_id=group_id,
                        kind="payout",
                        correlation_id=correlation_id,
                        entries=[(account_id, -amount), (RAIL_CLEARING, amount)],
                        payout_id=payout_id,
                        token=token,
                    )
                    await write_event(
                        conn,
                        event_type="ledger.posted",
                        ctx=ctx,
                        correlation_id=correlation_id,
                        payload={
                            "kind": "payout",
                            "group_id": str(group_id),
                            "payout_id": payout_id,
                            "account_id": account_id,
                            "amount": amount,
                            "entries": [[account_id, -amount], [RAIL_CLEARING, amount]],
                        },
                    )
            except FencedOut as exc:
                self._report_fenced_out(exc, payout_id, operation)
                raise
        metrics.TRANSITIONS.labels(from_state=S.RAIL_ACKED, to_state=S.POSTED).inc()
        metrics.LEDGER_GROUPS.labels(kind="payout").inc()
        return result

    async def record_audit(
        self,
        *,
        actor: str,
        action: str,
        payout_id: str | None = None,
        account_id: str | None = None,
        token: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """An audit row with no state change (a rejected operator signal, an escalation)."""
        check_text(actor, "actor")
        check_text(action, "action")
        async with self._pool.acquire() as conn, conn.transaction():
            await write_audit(
                conn,
                actor=actor,
                action=action,
                token=token,
                payout_id=payout_id,
                account_id=account_id,
                details=details,
            )

    # ------------------------------------------------------------------ internals

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
    ) -> Payout | AlreadyAdvanced:
        """A transition of the payout row (plus its audit and outbox rows), fenced on the payout
        row AND on the account's balance row: the lock protects the account's payout stream
        (A-15), so a holder superseded on the account cannot advance any of its payouts, even
        one the new holder has not touched yet (INV-01)."""
        check_payout_id(payout_id)
        check_token(token)
        async with self._pool.acquire() as conn:
            try:
                async with _committed(conn) as facts:
                    account_id, _ = await self._granted_account(
                        conn, payout_id, token, grant, operation
                    )
                    await self._stamp_balance(conn, account_id, token, operation, payout_id)
                    return await self._transition(
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
        if to_state in PAYOUT_EVENTS:  # the others are not sent downstream (ledger.outbox)
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
        # Stated only once COMMIT succeeded (`_committed`): a rolled-back posting of a frozen
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

    async def _granted_account(
        self,
        conn: asyncpg.Connection,
        payout_id: str,
        token: int,
        grant: GrantLike,
        operation: str,
    ) -> tuple[str, int]:
        """The payout's account and amount, once the grant is proved to be the lock service's
        grant of that account's key for `token` (INV-07); `InvalidGrant` otherwise.

        Runs before any write of the transaction (only the payout's account is read first, to
        know which key the grant must be for). What it prevents: a made-up token raising the
        account's fence above anything the lock service can issue, or moving a payout. Whether
        the genuine token is the newest is still the fence's decision, next.
        """
        account_id, amount = await self._payout_account(conn, payout_id)
        if self._verifier is not None:
            try:
                genuine = self._verifier.verify(
                    grant, key=lock_key(account_id), token=token, check_expiry=False
                )
                if is_expired(genuine):
                    # A stale holder is told it is fenced out first (as `_classify_miss` does):
                    # read-only, an expired grant moves no fence, not even to its own token.
                    await self._refuse_if_fenced(conn, account_id, token)
                    raise GrantExpired(f"grant expired at {genuine.expires_at.isoformat()}")
            except GrantError as exc:
                log.warning(
                    "grant.refused",
                    enforcement_point="paydb",
                    reason=exc.code,
                    payout_id=payout_id,
                    operation=operation,
                    presented_token=token,
                )
                metrics.GRANT_REFUSED.labels(operation=operation, reason=exc.code).inc()
                raise InvalidGrant(str(exc), reason=exc.code) from None
        return account_id, amount

    async def _refuse_if_fenced(
        self, conn: asyncpg.Connection, account_id: str, token: int
    ) -> None:
        stored = await conn.fetchval(
            "SELECT fence FROM paydb.balances WHERE account_id = $1", account_id
        )
        if self._enforce_fencing and stored is not None and int(stored) > token:
            raise FencedOut(lock_key(account_id), token, int(stored))

    async def _payout_account(self, conn: asyncpg.Connection, payout_id: str) -> tuple[str, int]:
        row = await conn.fetchrow(
            "SELECT account_id, amount FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
        if row is None:
            raise UnknownPayout(f"unknown payout {payout_id!r}")
        return row["account_id"], int(row["amount"])

    async def _customer_account(self, conn: asyncpg.Connection, account_id: str) -> None:
        kind = await conn.fetchval(
            "SELECT kind FROM paydb.accounts WHERE account_id = $1", account_id
        )
        if kind is None:
            raise UnknownAccount(f"unknown account {account_id!r}")
        if kind != "customer" or account_id in SYSTEM_ACCOUNTS:
            raise InvalidIdentifier(f"{account_id} is a system account, not a customer account")

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
