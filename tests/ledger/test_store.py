"""Integration tests of the fenced payout store against a real PostgreSQL."""

from __future__ import annotations

import json

import asyncpg
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from ledger import (
    AlreadyAdvanced,
    FencedOut,
    InvalidTransition,
    Payout,
    PayoutState,
    PayoutStore,
    WorkContext,
)
from ledger.queries import ledger_discrepancies
from tests.ledger.conftest import funded_account, new_id

S = PayoutState


def _fenced_count(operation: str) -> float:
    value = REGISTRY.get_sample_value("paydb_fenced_out_total", {"operation": operation})
    return value or 0.0


async def _payout(store: PayoutStore, ctx: WorkContext, *, funds: int, amount: int) -> Payout:
    account = await funded_account(store, ctx, funds)
    return await store.create_payout(new_id("po"), account, amount, ctx)


async def _audit(pool: asyncpg.Pool, payout_id: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        rows: list[asyncpg.Record] = await conn.fetch(
            "SELECT * FROM paydb.audit_log WHERE payout_id = $1 ORDER BY audit_id", payout_id
        )
        return rows


async def test_happy_path_posts_ledger_and_balances(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """claim -> submitted -> acked -> posted debits the account, credits clearing, in one group."""
    p = await _payout(store, ctx, funds=10_000, amount=2_500)
    clearing_before = await store.balance("rail_clearing")
    assert p.state is S.PENDING and p.client_reference == p.payout_id
    for step in (store.claim, store.mark_submitted, store.mark_acked):
        result = await step(p.payout_id, 7, ctx)
        assert isinstance(result, Payout) and result.fence == 7
    posted = await store.post(p.payout_id, 7, ctx)
    assert isinstance(posted, Payout) and posted.state is S.POSTED
    assert posted.ledger_group_id is not None
    assert await store.balance(p.account_id) == 7_500
    assert await store.balance("rail_clearing") == clearing_before + 2_500

    async with pool.acquire() as conn:
        entries = await conn.fetch(
            "SELECT account_id, amount FROM paydb.ledger_entries WHERE group_id = $1",
            posted.ledger_group_id,
        )
        assert sorted((e["account_id"], e["amount"]) for e in entries) == sorted(
            [(p.account_id, -2_500), ("rail_clearing", 2_500)]
        )
        events = await conn.fetch(
            "SELECT event_type, correlation_id, contract_version FROM paydb.outbox"
            " WHERE payload->>'payout_id' = $1 ORDER BY occurred_at",
            p.payout_id,
        )
        assert [e["event_type"] for e in events] == [
            "payout.created",
            "payout.claimed",
            "payout.rail_submitted",
            "payout.rail_acked",
            "payout.posted",
            "ledger.posted",
        ]
        assert events[-1]["correlation_id"] == (
            f"{p.account_id}:{p.payout_id}:{posted.ledger_group_id}"
        )
        assert events[1]["correlation_id"] == ctx.correlation_id
        assert await ledger_discrepancies(conn) == []
    audit = await _audit(pool, p.payout_id)
    assert [(a["action"], a["from_state"], a["to_state"], a["token"]) for a in audit] == [
        ("payout.created", None, "PENDING", None),
        ("claim", "PENDING", "CLAIMED", 7),
        ("mark_submitted", "CLAIMED", "RAIL_SUBMITTED", 7),
        ("mark_acked", "RAIL_SUBMITTED", "RAIL_ACKED", 7),
        ("post", "RAIL_ACKED", "POSTED", 7),
    ]
    assert {a["actor"] for a in audit} == {"test-worker"}


async def test_decline_fails_without_ledger_movement(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """A rail decline moves RAIL_SUBMITTED -> FAILED with the reason and posts nothing."""
    p = await _payout(store, ctx, funds=1_000, amount=400)
    await store.claim(p.payout_id, 3, ctx)
    await store.mark_submitted(p.payout_id, 3, ctx)
    failed = await store.mark_declined(p.payout_id, 3, ctx, reason="account_closed")
    assert isinstance(failed, Payout)
    assert (failed.state, failed.failure_reason) == (S.FAILED, "account_closed")
    assert await store.balance(p.account_id) == 1_000
    # Terminal: even the same grant cannot move it on.
    with pytest.raises(InvalidTransition):
        await store.post(p.payout_id, 3, ctx)


async def test_insufficient_funds_fails_at_claim(store: PayoutStore, ctx: WorkContext) -> None:
    """A claim with available < amount ends FAILED(insufficient_funds), counting in-flight ones."""
    account = await funded_account(store, ctx, 1_000)
    first = await store.create_payout(new_id("po"), account, 700, ctx)
    second = await store.create_payout(new_id("po"), account, 400, ctx)
    claimed = await store.claim(first.payout_id, 5, ctx)
    assert isinstance(claimed, Payout) and claimed.state is S.CLAIMED
    # The balance is still 1000, but 700 are in flight: only 300 are available.
    failed = await store.claim(second.payout_id, 6, ctx)
    assert isinstance(failed, Payout)
    assert (failed.state, failed.failure_reason) == (S.FAILED, "insufficient_funds")
    assert failed.fence == 6
    assert await store.balance(account) == 1_000


async def test_stale_token_is_fenced_out_with_event_and_counter(
    store: PayoutStore, ctx: WorkContext
) -> None:
    """A write with T1 after T2 stamped the row raises FencedOut(key, presented, stored)."""
    p = await _payout(store, ctx, funds=1_000, amount=100)
    await store.claim(p.payout_id, 10, ctx)
    await store.mark_submitted(p.payout_id, 20, ctx)  # the newer holder's step, same state
    before = _fenced_count("mark_acked")
    with capture_logs() as logs, pytest.raises(FencedOut) as info:
        await store.mark_acked(p.payout_id, 10, ctx)
    err = info.value
    assert (err.key, err.presented_token, err.stored_token) == (f"payout:{p.account_id}", 10, 20)
    fenced = [e for e in logs if e["event"] == "lock.fenced_out"]
    assert len(fenced) == 1
    assert {
        k: fenced[0][k]
        for k in ("key", "presented_token", "stored_token", "payout_id", "operation", "log_level")
    } == {
        "key": f"payout:{p.account_id}",
        "presented_token": 10,
        "stored_token": 20,
        "payout_id": p.payout_id,
        "operation": "mark_acked",
        "log_level": "warning",
    }
    assert _fenced_count("mark_acked") == before + 1
    still = await store.get_payout(p.payout_id)
    assert (still.state, still.fence) == (S.RAIL_SUBMITTED, 20)


async def test_stale_token_on_balance_row_is_fenced_out(
    store: PayoutStore, ctx: WorkContext
) -> None:
    """The balance row is an enforcement point: a post under a token below its fence fails."""
    account = await funded_account(store, ctx, 1_000)
    p1 = await store.create_payout(new_id("po"), account, 100, ctx)
    p2 = await store.create_payout(new_id("po"), account, 100, ctx)
    for step in (store.claim, store.mark_submitted, store.mark_acked):
        await step(p1.payout_id, 4, ctx)
    # A newer grant on the same account claims another payout, stamping the balance fence.
    await store.claim(p2.payout_id, 9, ctx)
    with pytest.raises(FencedOut) as info:
        await store.post(p1.payout_id, 4, ctx)
    assert (info.value.presented_token, info.value.stored_token) == (4, 9)
    assert (await store.get_payout(p1.payout_id)).state is S.RAIL_ACKED
    assert await store.balance(account) == 1_000


async def test_already_advanced_is_not_an_error(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """A newer holder finding the payout already past the step gets AlreadyAdvanced, no write."""
    p = await _payout(store, ctx, funds=1_000, amount=100)
    for step in (store.claim, store.mark_submitted, store.mark_acked, store.post):
        await step(p.payout_id, 5, ctx)
    audit_before = len(await _audit(pool, p.payout_id))
    with capture_logs() as logs:
        outcome = await store.claim(p.payout_id, 6, ctx)
        again = await store.post(p.payout_id, 6, ctx)
    assert outcome == AlreadyAdvanced(payout_id=p.payout_id, state=S.POSTED, fence=5)
    assert isinstance(again, AlreadyAdvanced)
    assert not [e for e in logs if e["event"] == "lock.fenced_out"]
    assert len(await _audit(pool, p.payout_id)) == audit_before
    assert await store.balance(p.account_id) == 900  # posted once


@pytest.mark.parametrize("newer_claims", [True, False], ids=["newer-claims", "control-no-claim"])
async def test_a_claim_past_pending_still_fences_the_older_holder_out(
    store: PayoutStore, ctx: WorkContext, newer_claims: bool
) -> None:
    """The workers' claim step claims without reading first (issue 29): a newer holder's claim
    of a payout the older holder already moved on is AlreadyAdvanced, and its transaction still
    commits the account's fence = its token, so the older holder, thawed, cannot advance the
    payout any more (INV-01). Control: without that claim the older holder's write goes through,
    which is what the stamp is for."""
    p = await _payout(store, ctx, funds=1_000, amount=100)
    await store.claim(p.payout_id, 5, ctx)
    await store.mark_submitted(p.payout_id, 5, ctx)
    if newer_claims:
        outcome = await store.claim(p.payout_id, 6, ctx)
        assert outcome == AlreadyAdvanced(payout_id=p.payout_id, state=S.RAIL_SUBMITTED, fence=5)
        with pytest.raises(FencedOut) as info:
            await store.mark_acked(p.payout_id, 5, ctx)
        assert (info.value.presented_token, info.value.stored_token) == (5, 6)
        assert (await store.get_payout(p.payout_id)).state is S.RAIL_SUBMITTED
    else:
        acked = await store.mark_acked(p.payout_id, 5, ctx)
        assert isinstance(acked, Payout) and acked.state is S.RAIL_ACKED


async def test_step_out_of_order_is_invalid_transition(
    store: PayoutStore, ctx: WorkContext
) -> None:
    """Acking a payout that was never submitted is InvalidTransition, not AlreadyAdvanced."""
    p = await _payout(store, ctx, funds=1_000, amount=100)
    await store.claim(p.payout_id, 5, ctx)
    with pytest.raises(InvalidTransition):
        await store.mark_acked(p.payout_id, 5, ctx)
    with pytest.raises(InvalidTransition):
        await store.post(p.payout_id, 5, ctx)
    assert (await store.get_payout(p.payout_id)).state is S.CLAIMED


async def test_ambiguous_resolutions_and_operator_abandon(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """RAIL_AMBIGUOUS resolves to settled (then posts), absent (FAILED), or operator abandon."""
    results = {}
    for outcome in ("settled", "absent", "abandon"):
        p = await _payout(store, ctx, funds=1_000, amount=100)
        for step in (store.claim, store.mark_submitted, store.mark_ambiguous):
            await step(p.payout_id, 8, ctx)
        if outcome == "settled":
            await store.resolve_settled(p.payout_id, 8, ctx)
            final = await store.post(p.payout_id, 8, ctx)
        elif outcome == "absent":
            final = await store.resolve_absent(p.payout_id, 8, ctx)
        else:
            final = await store.abandon(
                p.payout_id, 8, ctx, operator="ops:alice", reason="rail SLA exceeded"
            )
        assert isinstance(final, Payout)
        results[outcome] = (final.state, await store.balance(p.account_id))
        if outcome == "abandon":
            audit = (await _audit(pool, p.payout_id))[-1]
            assert (audit["actor"], audit["action"], audit["token"]) == ("ops:alice", "abandon", 8)
            assert json.loads(audit["details"])["reason"] == "rail SLA exceeded"
    assert results == {
        "settled": (S.POSTED, 900),
        "absent": (S.FAILED, 1_000),
        "abandon": (S.ABANDONED, 1_000),
    }


async def test_reads_list_by_state_and_account(store: PayoutStore, ctx: WorkContext) -> None:
    """list_payouts filters by state and account; get_payout and balance read one row."""
    account = await funded_account(store, ctx, 1_000)
    a = await store.create_payout(new_id("po"), account, 10, ctx)
    b = await store.create_payout(new_id("po"), account, 20, ctx)
    await store.claim(a.payout_id, 2, ctx)
    pending = await store.list_payouts(state="PENDING", account_id=account)
    claimed = await store.list_payouts(state=S.CLAIMED, account_id=account)
    assert [p.payout_id for p in pending] == [b.payout_id]
    assert [p.payout_id for p in claimed] == [a.payout_id]
    assert {p.payout_id for p in await store.list_payouts(account_id=account)} == {
        a.payout_id,
        b.payout_id,
    }
    assert (await store.get_payout(b.payout_id)).amount == 20


async def test_fencing_disabled_is_logged_loudly(pool: asyncpg.Pool) -> None:
    """Constructing a store with enforce_fencing=False logs one fencing.disabled warning."""
    with capture_logs() as logs:
        PayoutStore(pool, enforce_fencing=False)
        PayoutStore(pool)
    assert [(e["event"], e["log_level"]) for e in logs] == [("fencing.disabled", "warning")]


async def test_a_rolled_back_posting_states_no_transition(
    store: PayoutStore, ctx: WorkContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`payout.transition` states a committed fact: when the posting's transaction rolls back
    after its payout update (here the ledger write fails inside it), no transition to POSTED is
    logged and the payout is still RAIL_ACKED; the committed steps before it were logged."""
    p = await _payout(store, ctx, funds=10_000, amount=100)
    with capture_logs() as logs:
        for step in (store.claim, store.mark_submitted, store.mark_acked):
            await step(p.payout_id, 7, ctx)

        async def failing_group(*args: object, **kwargs: object) -> None:
            raise asyncpg.PostgresError("the ledger write failed inside the transaction")

        monkeypatch.setattr("ledger.store.steps.write_posting", failing_group)
        with pytest.raises(asyncpg.PostgresError):
            await store.post(p.payout_id, 7, ctx)
    stated = [e["to_state"] for e in logs if e["event"] == "payout.transition"]
    assert stated == ["CLAIMED", "RAIL_SUBMITTED", "RAIL_ACKED"]
    assert (await store.get_payout(p.payout_id)).state is S.RAIL_ACKED
