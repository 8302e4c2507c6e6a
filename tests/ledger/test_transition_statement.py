"""The transition's one statement (`ledger.store.fenced._TRANSITION`, issue 29) against a real
PostgreSQL: the fenced update, its audit row and its outbox event in one round trip write the
same rows that `write_audit` and `write_event` write for that transition, and when the fenced
update matches nothing (a payout already moved on, a stale token) neither row is written."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from ledger import AlreadyAdvanced, FencedOut, PayoutStore, WorkContext
from ledger.audit import write_audit
from ledger.outbox import write_event
from tests.ledger.conftest import funded_account, new_id, rolled_back

_AUDIT = (
    "SELECT actor, token, action, payout_id, account_id, from_state, to_state, details"
    " FROM paydb.audit_log WHERE payout_id = $1 ORDER BY audit_id"
)
_EVENTS = (
    "SELECT event_type, correlation_id, causation_id, contract_version, payload, traceparent,"
    " tracestate FROM paydb.outbox WHERE payload->>'payout_id' = $1 ORDER BY occurred_at"
)


async def _rows(conn: asyncpg.Connection, payout_id: str) -> tuple[list[Any], list[Any]]:
    audit = [dict(r) for r in await conn.fetch(_AUDIT, payout_id)]
    events = [dict(r) for r in await conn.fetch(_EVENTS, payout_id)]
    return audit, events


@pytest.mark.parametrize(
    ("amount", "to_state", "reason"),
    [(300, "CLAIMED", None), (5_000, "FAILED", "insufficient_funds")],
)
async def test_a_transition_writes_what_the_helpers_write(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    amount: int,
    to_state: str,
    reason: str | None,
) -> None:
    """The claim (PENDING -> CLAIMED, or FAILED for want of funds: a failure reason the
    statement takes from its own update) beside the helpers' rows for the same facts, written
    in a transaction that is rolled back."""
    account = await funded_account(store, ctx, 1_000)
    p = await store.create_payout(new_id("po"), account, amount, ctx)
    # First the helpers' rows, before the claim (an event's delivery key is unique, and neither
    # table lets a row be deleted), in a transaction rolled back.
    async with rolled_back(pool) as conn:
        await write_audit(
            conn,
            actor=ctx.actor,
            action="claim",
            token=7,
            payout_id=p.payout_id,
            account_id=account,
            from_state="PENDING",
            to_state=to_state,
            details={
                "reason": reason,
                "available": 1_000,
                "amount": amount,
                "via": ctx.actor,
            },
        )
        await write_event(
            conn,
            event_type=f"payout.{to_state.lower()}",
            ctx=ctx,
            payload={
                "payout_id": p.payout_id,
                "account_id": account,
                "amount": amount,
                "from_state": "PENDING",
                "to_state": to_state,
                "token": 7,
                "client_reference": p.client_reference,
                "failure_reason": reason,
            },
        )
        by_helpers = await _rows(conn, p.payout_id)
    claimed = await store.claim(p.payout_id, 7, ctx)
    assert not isinstance(claimed, AlreadyAdvanced)
    assert claimed.state == to_state
    async with pool.acquire() as conn:
        by_statement = await _rows(conn, p.payout_id)
    # The payout's creation wrote one audit row and one event; the claim's come next.
    assert [len(by_statement[0]), len(by_statement[1])] == [2, 2]
    assert by_statement == by_helpers


async def test_a_miss_writes_neither_row(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """A second claim finds the payout moved on (AlreadyAdvanced): the update matched nothing,
    so nothing else of the statement was written. An older token is refused before it
    (FencedOut at the balance row) and writes nothing either."""
    account = await funded_account(store, ctx, 1_000)
    p = await store.create_payout(new_id("po"), account, 300, ctx)
    await store.claim(p.payout_id, 7, ctx)
    async with pool.acquire() as conn:
        after_claim = await _rows(conn, p.payout_id)
    assert isinstance(await store.claim(p.payout_id, 7, ctx), AlreadyAdvanced)
    with pytest.raises(FencedOut):
        await store.mark_submitted(p.payout_id, 6, ctx)
    async with pool.acquire() as conn:
        assert await _rows(conn, p.payout_id) == after_claim
    # The control: the same statement from the state it names writes both rows.
    await store.mark_submitted(p.payout_id, 7, ctx)
    async with pool.acquire() as conn:
        audit, events = await _rows(conn, p.payout_id)
    assert [len(audit), len(events)] == [len(after_claim[0]) + 1, len(after_claim[1]) + 1]
    assert audit[-1]["action"] == "mark_submitted"
    assert events[-1]["event_type"] == "payout.rail_submitted"
