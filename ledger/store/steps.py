"""The worker's steps of a payout: claim (or stamp the account's fence when it finds the payout
past PENDING), submit, ack or decline, post (UC-01).

Each step is one fenced transaction of the `FencedWriter` it is given (`ledger.store.fenced`: the
grant checked first, T >= the stored fence on the payout row and on the account's balance row,
fence stamped = T): a superseded holder is fenced out, and a step another holder already took
returns `AlreadyAdvanced` without writing.
"""

from __future__ import annotations

import uuid

import asyncpg

from ledger import metrics
from ledger.context import WorkContext
from ledger.journal import RAIL_CLEARING
from ledger.outbox import EVENT_COLUMNS, event_values
from ledger.records import AlreadyAdvanced, Payout, check_text
from ledger.states import IN_FLIGHT_STATES
from ledger.store.base import GrantLike, S
from ledger.store.fenced import FencedTransaction, FencedWriter

__all__ = ["INSUFFICIENT_FUNDS", "WorkerSteps"]

INSUFFICIENT_FUNDS = "insufficient_funds"


class WorkerSteps:
    """PENDING -> CLAIMED (or FAILED) -> RAIL_SUBMITTED -> RAIL_ACKED (or FAILED) -> POSTED."""

    def __init__(self, writer: FencedWriter) -> None:
        self._writer = writer

    async def claim(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """PENDING -> CLAIMED, or PENDING -> FAILED(insufficient_funds) (UC-01 step 4, A-09).

        One transaction: the account's balance row is locked and fence-stamped, available funds
        = balance - amounts of this account's in-flight payouts, then the fenced payout update.
        A payout already past PENDING is `AlreadyAdvanced` and the transaction still commits:
        the claim of a newer holder that only recovers or posts stamps the account's fence all
        the same (see `stamp_account_fence` for why that matters).
        """
        operation = "claim"
        async with self._writer.transaction(operation, payout_id, token, grant) as tx:
            in_flight = await tx.conn.fetchval(
                "SELECT COALESCE(SUM(amount), 0) FROM paydb.payouts"
                " WHERE account_id = $1 AND state = ANY($2::text[]) AND payout_id <> $3",
                tx.account_id,
                [str(s) for s in IN_FLIGHT_STATES],
                payout_id,
            )
            available = tx.balance - int(in_flight)
            details = {"available": available, "amount": tx.amount}
            funded = available >= tx.amount
            return await tx.transition(
                operation,
                ctx,
                from_state=S.PENDING,
                to_state=S.CLAIMED if funded else S.FAILED,
                reason=None if funded else INSUFFICIENT_FUNDS,
                details=details,
            )

    async def stamp_account_fence(
        self, payout_id: str, token: int, *, grant: GrantLike = None
    ) -> None:
        """Raise the fence of the payout's account's balance row to T, whatever state the payout
        is in (T >= fence: stamp T; lower: `FencedOut`). No payout row changes.

        Why: a newer holder that finds the payout CLAIMED, RAIL_SUBMITTED, ... only recovers or
        posts. Without a stamp the account's fence stays at the older holder's token, and that
        holder, thawed from a pause, could still advance the account's payouts at the payment
        database until the newer one happened to write (INV-01). The stamp fences it out at
        once. The workers' claim step gets it from `claim`'s committed transaction; this one
        stamps without any transition.
        """
        # Opening the fenced transaction is the stamp (grant checked, balance row fenced = T);
        # nothing else is written in it.
        async with self._writer.transaction("stamp_account_fence", payout_id, token, grant):
            pass

    async def mark_submitted(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED: the proxy has durably recorded the attempt."""
        return await self._writer.transition(
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
        return await self._writer.transition(
            "mark_acked",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_SUBMITTED,
            to_state=S.RAIL_ACKED,
        )

    async def mark_submitted_and_acked(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED -> RAIL_ACKED in ONE transaction, for a submit whose rail
        acknowledgement came back in the same answer (issue 16: one commit instead of two).

        The same facts as `mark_submitted` then `mark_acked`: both audit rows, both outbox events,
        both `payout.transition` events (after COMMIT), each fenced exactly as there. Moves no
        money by itself: the proxy had already recorded the attempt and its ACKED outcome.
        """
        return await self._writer.transition(
            "mark_submitted",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.CLAIMED,
            to_state=S.RAIL_SUBMITTED,
            then=("mark_acked", S.RAIL_ACKED),
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
        return await self._writer.transition(
            "mark_declined",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_SUBMITTED,
            to_state=S.FAILED,
            reason=reason,
        )

    async def post(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_ACKED -> POSTED with the ledger and balance, in ONE transaction (UC-01 step 8).

        Money cannot be debited twice: the RAIL_ACKED -> POSTED update matches a row at most
        once (row lock + state condition), the ledger group is only written when it matched, and
        ledger_groups.payout_id is UNIQUE as a last line.
        """
        posted: Payout | AlreadyAdvanced
        async with self._writer.transaction("post", payout_id, token, grant) as tx:
            posted = await _post_in(tx, ctx)
        _count_posting(posted)
        return posted

    async def ack_and_post(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED -> RAIL_ACKED -> POSTED in ONE transaction, for the merged
        holder step's submit whose rail acknowledgement came back in its answer (issue 29: one
        fenced transaction and one commit instead of two, 4 statements fewer).

        The same facts as `mark_submitted_and_acked` then `post`: three audit rows, the three
        transitions' outbox events and `ledger.posted`, each transition fenced exactly as there.
        Money is debited only for a submit the rail acknowledged (the proxy recorded the attempt
        and its ACKED outcome before it answered), and at most once, as in `post`: the
        RAIL_ACKED -> POSTED update matches once and ledger_groups.payout_id is UNIQUE. If the
        transaction fails, nothing of it is written: the payout stays CLAIMED with the proxy's
        ACKED attempt on record, and recovery (`recover_from_attempt`) records the ack and then
        posts, by that evidence, never by submitting again.
        """
        result: Payout | AlreadyAdvanced
        async with self._writer.transaction("mark_submitted", payout_id, token, grant) as tx:
            result = await tx.transition(
                "mark_submitted", ctx, from_state=S.CLAIMED, to_state=S.RAIL_SUBMITTED
            )
            if not isinstance(result, AlreadyAdvanced):
                result = await tx.transition(
                    "mark_acked", ctx, from_state=S.RAIL_SUBMITTED, to_state=S.RAIL_ACKED
                )
            if not isinstance(result, AlreadyAdvanced):
                result = await _post_in(tx, ctx)
        _count_posting(result)
        return result


async def _post_in(tx: FencedTransaction, ctx: WorkContext) -> Payout | AlreadyAdvanced:
    """RAIL_ACKED -> POSTED, the ledger group and `ledger.posted`, in the open transaction `tx`:
    the group is written only when this transition matched (at most once per payout)."""
    payout_id, token = tx.payout_id, tx.token
    group_id = uuid.uuid4()
    account_id, amount = tx.account_id, tx.amount
    result = await tx.transition(
        "post",
        ctx,
        from_state=S.RAIL_ACKED,
        to_state=S.POSTED,
        group_id=group_id,
        details={"group_id": str(group_id), "amount": amount},
        record_metric=False,
    )
    if isinstance(result, AlreadyAdvanced):
        return result
    await write_posting(
        tx.conn,
        ctx,
        payout_id=payout_id,
        account_id=account_id,
        amount=amount,
        group_id=group_id,
        token=token,
    )
    return result


#: A payout's posting in ONE statement (issue 29): its ledger group, its two entries (the
#: customer's debit first, as `ledger.journal.write_group` orders them), both balance rows and the
#: `ledger.posted` event, where `write_group` and `write_event` took six round trips.
#: Lock order (write_group's rule: the customer's balance row first, system accounts after): the
#: caller's transaction locked the customer's row already, when it stamped its fence
#: (`FencedWriter.transaction`), so the only row lock taken here is RAIL_CLEARING's, and two
#: postings cannot wait on each other in a cycle whatever order the CTEs run in. INV-03 is
#: still the database's: the group's entries must sum to zero at COMMIT (deferred trigger).
_POSTING = (
    "WITH grouped AS ("
    " INSERT INTO paydb.ledger_groups (group_id, kind, payout_id, correlation_id, token)"
    " VALUES ($1, 'payout', $2, $3, $4)"
    "), entered AS ("
    " INSERT INTO paydb.ledger_entries (group_id, account_id, amount)"
    " VALUES ($1, $5, -$6::bigint), ($1, $7, $6::bigint)"
    "), debited AS ("
    " UPDATE paydb.balances SET balance = balance - $6::bigint, updated_at = now()"
    " WHERE account_id = $5"
    "), credited AS ("
    " UPDATE paydb.balances SET balance = balance + $6::bigint, updated_at = now()"
    " WHERE account_id = $7"
    f") INSERT INTO paydb.outbox ({EVENT_COLUMNS})"
    " VALUES ($8, $9, $10, $11, $12, $13::jsonb, $14, $15)"
)


async def write_posting(
    conn: asyncpg.Connection,
    ctx: WorkContext,
    *,
    payout_id: str,
    account_id: str,
    amount: int,
    group_id: uuid.UUID,
    token: int,
) -> None:
    """The payout's ledger group, entries, balances and `ledger.posted` event (`_POSTING`), in
    the caller's transaction, which must hold the customer's balance row already. Money: written
    only after this transaction's RAIL_ACKED -> POSTED update matched, and
    ledger_groups.payout_id is UNIQUE, so a payout is debited at most once."""
    if not conn.is_in_transaction():
        raise RuntimeError("a posting must be written inside the payout's transaction")
    correlation_id = f"{account_id}:{payout_id}:{group_id}"
    entries = [[account_id, -amount], [RAIL_CLEARING, amount]]
    event = event_values(
        event_type="ledger.posted",
        ctx=ctx,
        correlation_id=correlation_id,
        payload={
            "kind": "payout",
            "group_id": str(group_id),
            "payout_id": payout_id,
            "account_id": account_id,
            "amount": amount,
            "entries": entries,
        },
    )
    await conn.execute(
        _POSTING,
        group_id,
        payout_id,
        correlation_id,
        token,
        account_id,
        amount,
        RAIL_CLEARING,
        *event,
    )


def _count_posting(result: Payout | AlreadyAdvanced) -> None:
    """The posting's metrics, after COMMIT, only for a posting this transaction made."""
    if isinstance(result, AlreadyAdvanced) or result.state != S.POSTED:
        return
    metrics.TRANSITIONS.labels(from_state=S.RAIL_ACKED, to_state=S.POSTED).inc()
    metrics.LEDGER_GROUPS.labels(kind="payout").inc()
