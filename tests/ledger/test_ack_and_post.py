"""Integration tests of `PayoutStore.ack_and_post` against a real PostgreSQL: the merged holder
step's ack and posting in ONE fenced transaction (issue 29) write exactly what the separate
steps write, debit once, and on any failure write nothing, leaving a CLAIMED payout that the
separate steps (recovery) carry on from."""

from __future__ import annotations

import asyncpg
import pytest
from structlog.testing import capture_logs

from ledger import AlreadyAdvanced, FencedOut, Payout, PayoutState, PayoutStore, WorkContext
from ledger.queries import ledger_discrepancies
from tests.ledger.conftest import funded_account, new_id

S = PayoutState


async def _claimed(store: PayoutStore, ctx: WorkContext, token: int, amount: int = 300) -> Payout:
    account = await funded_account(store, ctx, 1_000)
    p = await store.create_payout(new_id("po"), account, amount, ctx)
    await store.claim(p.payout_id, token, ctx)
    return p


async def _written(pool: asyncpg.Pool, p: Payout) -> dict[str, list[tuple[object, ...]]]:
    """What a payout's steps wrote, without the ids that differ from payout to payout."""
    async with pool.acquire() as conn:
        audit = await conn.fetch(
            "SELECT action, from_state, to_state, token FROM paydb.audit_log"
            " WHERE payout_id = $1 ORDER BY audit_id",
            p.payout_id,
        )
        events = await conn.fetch(
            "SELECT event_type FROM paydb.outbox WHERE payload->>'payout_id' = $1"
            " ORDER BY occurred_at, event_id",
            p.payout_id,
        )
        entries = await conn.fetch(
            "SELECT e.account_id = $2 AS own, e.amount FROM paydb.ledger_entries e"
            " JOIN paydb.ledger_groups g USING (group_id) WHERE g.payout_id = $1"
            " ORDER BY e.amount",
            p.payout_id,
            p.account_id,
        )
    return {
        "audit": [tuple(r) for r in audit],
        "events": [tuple(r) for r in events],
        "entries": [tuple(r) for r in entries],
    }


async def test_one_transaction_writes_what_the_separate_steps_write(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    merged, stepwise = await _claimed(store, ctx, 7), await _claimed(store, ctx, 7)
    with capture_logs() as logs:
        posted = await store.ack_and_post(merged.payout_id, 7, ctx)
    for step in (store.mark_submitted, store.mark_acked, store.post):
        await step(stepwise.payout_id, 7, ctx)
    assert isinstance(posted, Payout) and posted.state is S.POSTED and posted.fence == 7
    assert posted.ledger_group_id is not None
    assert await _written(pool, merged) == await _written(pool, stepwise)
    assert (await _written(pool, merged))["entries"] == [(True, -300), (False, 300)]
    assert await store.balance(merged.account_id) == 700
    stated = [(e["from_state"], e["to_state"]) for e in logs if e["event"] == "payout.transition"]
    assert stated == [("CLAIMED", "RAIL_SUBMITTED"), ("RAIL_SUBMITTED", "RAIL_ACKED"),
                      ("RAIL_ACKED", "POSTED")]  # fmt: skip
    async with pool.acquire() as conn:
        assert await ledger_discrepancies(conn) == []


async def test_a_failure_inside_writes_nothing_and_recovery_goes_on_stepwise(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger write fails inside the one transaction: no transition is stated, the payout is
    still CLAIMED with only its claim on record and the account not debited. The separate steps
    (what recovery runs, by the proxy's ACKED attempt) then post it once."""
    p = await _claimed(store, ctx, 7)
    before = await _written(pool, p)

    async def failing_group(*args: object, **kwargs: object) -> None:
        raise asyncpg.PostgresError("the ledger write failed inside the transaction")

    with monkeypatch.context() as patch, capture_logs() as logs:
        patch.setattr("ledger.store.steps.write_posting", failing_group)
        with pytest.raises(asyncpg.PostgresError):
            await store.ack_and_post(p.payout_id, 7, ctx)
    assert not [e for e in logs if e["event"] == "payout.transition"]
    assert (await store.get_payout(p.payout_id)).state is S.CLAIMED
    assert await _written(pool, p) == before
    assert await store.balance(p.account_id) == 1_000
    for step in (store.mark_submitted, store.mark_acked, store.post):
        await step(p.payout_id, 7, ctx)
    assert await store.balance(p.account_id) == 700


@pytest.mark.parametrize("newer_claims", [True, False], ids=["newer-claims", "control-no-claim"])
async def test_an_older_holder_is_fenced_out_before_anything_is_written(
    store: PayoutStore, ctx: WorkContext, newer_claims: bool
) -> None:
    """A newer grant on the account claims another of its payouts: the older holder's one
    transaction is fenced out on the balance row and writes nothing. Control: without the newer
    claim, the same call posts."""
    p = await _claimed(store, ctx, 4)
    if newer_claims:
        other = await store.create_payout(new_id("po"), p.account_id, 100, ctx)
        await store.claim(other.payout_id, 9, ctx)
        with pytest.raises(FencedOut) as info:
            await store.ack_and_post(p.payout_id, 4, ctx)
        assert (info.value.presented_token, info.value.stored_token) == (4, 9)
        assert (await store.get_payout(p.payout_id)).state is S.CLAIMED
        assert await store.balance(p.account_id) == 1_000
    else:
        posted = await store.ack_and_post(p.payout_id, 4, ctx)
        assert isinstance(posted, Payout) and posted.state is S.POSTED
        assert await store.balance(p.account_id) == 700


async def test_a_payout_already_posted_is_not_debited_again(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    p = await _claimed(store, ctx, 5)
    first = await store.ack_and_post(p.payout_id, 5, ctx)
    written = await _written(pool, p)
    again = await store.ack_and_post(p.payout_id, 6, ctx)
    assert isinstance(first, Payout) and first.state is S.POSTED
    assert again == AlreadyAdvanced(payout_id=p.payout_id, state=S.POSTED, fence=5)
    assert await _written(pool, p) == written
    assert await store.balance(p.account_id) == 700
