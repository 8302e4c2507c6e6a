"""Integration tests of the reconciler against real PostgreSQL, a real rail proxy and the real rail
stub: a clean scenario reports seven explicit zeros, and one negative control per class shows that
class (and only it) is detected, with the offending id in its sample."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from structlog.testing import capture_logs

from reconcile.reconciler import InvalidWindow, Window, WindowNotClosed
from reconcile.rules import CLASSES
from tests.reconcile.conftest import World, window_until_now


async def start_of(w: World) -> datetime:
    return await w.db_now() - timedelta(milliseconds=1)


def only(report_counts: dict[str, int], cls: str) -> dict[str, int]:
    """The expected counts: one break of `cls`, zero of every other class."""
    return {c: (1 if c == cls else 0) for c in CLASSES}


async def test_clean_scenario_reports_every_class_as_zero(world: World) -> None:
    """Payouts acked and posted, declined, ambiguous-then-settled, unfunded and fresh-ambiguous
    give zero discrepancies, with all seven classes present and one event per class."""
    start = await start_of(world)
    for amount in (1000, 2500, 4200):
        await world.pay(amount)
    await world.pay(1013)  # declined by the rail
    await world.pay(5_000_000)  # insufficient funds: FAILED at claim, no rail call
    settled = await world.pay(2077)  # ambiguous at the rail (500), but the movement exists
    token = world.next_token()
    await world.store.resolve_settled(settled, token, world.ctx)  # what the lookup would show
    await world.store.post(settled, token, world.ctx)
    await world.pay(3077)  # still ambiguous, well within the 4 h SLA
    await world.new_payout(700)  # PENDING, never started
    with capture_logs() as events:
        report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == {c: 0 for c in CLASSES}
    assert report.ok and report.checked_payouts == 8
    per_class = [e for e in events if e["event"] == "reconcile.discrepancy"]
    assert sorted(e["class"] for e in per_class) == sorted(CLASSES)
    assert all(e["count"] == 0 and e["sample"] == [] for e in per_class)
    (done,) = [e for e in events if e["event"] == "reconcile.completed"]
    assert done["counts"] == {c: 0 for c in CLASSES} and done["ok"] is True


async def test_duplicate_submission_two_movements_for_one_reference(world: World) -> None:
    """A second rail movement for a paid payout's reference is a duplicate submission."""
    start = await start_of(world)
    payout_id = await world.pay(1000)
    await world.stub_payment(payout_id, 1000)  # the rail is not idempotent: money moves twice
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "duplicate_submission")
    assert report.samples["duplicate_submission"] == [payout_id]


async def test_duplicate_submission_two_live_attempts(world: World) -> None:
    """Two possibly-forwarded proxy attempts for one payout (guard bypassed) are a duplicate."""
    start = await start_of(world)
    payout_id = await world.pay(1000)
    async with world.pool.acquire() as conn:
        # The negative control needs the FR-18 guard off: a row outside the unique index, as
        # the proxy's ENFORCE_SUBMISSION_GUARD=false experiment would write it.
        await conn.execute(
            "INSERT INTO railproxy.attempts (payout_id, account_id, amount, client_reference,"
            " token, correlation_id, causation_id, deadline_at, adapter_version,"
            " contract_version, connection_id, fencing_enforced, guard_bypassed, outcome)"
            " SELECT payout_id, account_id, amount, client_reference, token, correlation_id,"
            " causation_id, deadline_at, adapter_version, contract_version, connection_id,"
            " fencing_enforced, true, 'UNKNOWN' FROM railproxy.attempts WHERE payout_id = $1",
            payout_id,
        )
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "duplicate_submission")
    assert report.samples["duplicate_submission"] == [payout_id]


async def test_submission_without_ledger_after_window_closed(world: World) -> None:
    """An ACKED attempt whose payout sat unposted past the window's end is a break; the same
    payout is in flight (no break) for a window that closed before its last transition."""
    start = await start_of(world)
    payout_id = await world.pay(1000, post=False)  # RAIL_ACKED, never posted
    payout = await world.store.get_payout(payout_id)
    in_flight = await world.reconcile(Window(start=start, end=payout.updated_at))
    assert in_flight.counts == {c: 0 for c in CLASSES}
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "submission_without_ledger")
    assert report.samples["submission_without_ledger"] == [payout_id]


async def test_ledger_without_submission(world: World) -> None:
    """A posting for a payout that never went through the proxy nor reached the rail is a break."""
    start = await start_of(world)
    payout_id = await world.new_payout(1500)
    token = world.next_token()
    for step in ("claim", "mark_submitted", "mark_acked", "post"):
        await getattr(world.store, step)(payout_id, token, world.ctx)  # no proxy call at all
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "ledger_without_submission")
    assert report.samples["ledger_without_submission"] == [payout_id]


async def test_balance_mismatch_when_balance_differs_from_entries(world: World) -> None:
    """A balance row edited behind the ledger's back is a balance mismatch for that account."""
    start = await start_of(world)
    await world.pay(1000)
    async with world.pool.acquire() as conn:
        # No trigger guards balances against a direct UPDATE (the fence is the store's guard),
        # so the corruption needs no trigger to be disabled.
        await conn.execute(
            "UPDATE paydb.balances SET balance = balance + 1 WHERE account_id = $1",
            world.account_id,
        )
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "balance_mismatch")
    assert report.samples["balance_mismatch"] == [world.account_id]


async def test_ambiguous_beyond_sla_old_timestamp(world: World) -> None:
    """A payout RAIL_AMBIGUOUS for longer than the SLA is escalated by the reconciler."""
    start = await start_of(world)
    async with world.pool.acquire() as conn:
        # Five hours of ambiguity cannot be waited for: the row is written with old timestamps.
        # INSERT is not guarded by payouts_guard (that trigger is BEFORE UPDATE only).
        await conn.execute(
            "INSERT INTO paydb.payouts (payout_id, account_id, amount, state, fence,"
            " client_reference, created_at, updated_at)"
            " VALUES ('po-old-ambiguous', $1, 900, 'RAIL_AMBIGUOUS', 1, 'po-old-ambiguous',"
            " now() - interval '6 hours', now() - interval '5 hours')",
            world.account_id,
        )
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "ambiguous_beyond_sla")
    assert report.samples["ambiguous_beyond_sla"] == ["po-old-ambiguous"]


async def test_ambiguous_sla_is_configurable(world: World) -> None:
    """A real ambiguous payout is within the default SLA but beyond a zero SLA."""
    start = await start_of(world)
    payout_id = await world.pay(4077)
    window = await window_until_now(world, start)
    assert (await world.reconcile(window)).ok
    report = await world.reconcile(window, ambiguity_sla=timedelta(0))
    assert report.counts == only(report.counts, "ambiguous_beyond_sla")
    assert report.samples["ambiguous_beyond_sla"] == [payout_id]


async def test_movement_without_attempt(world: World) -> None:
    """A rail movement whose reference the proxy never recorded is reported by movement id."""
    start = await start_of(world)
    await world.pay(1000)
    movement_id = await world.stub_payment("stray-reference")
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "movement_without_attempt")
    assert report.samples["movement_without_attempt"] == [movement_id]


async def test_samples_are_bounded_but_counts_are_not(world: World) -> None:
    """Twelve stray movements count as twelve, with a sample of at most `sample_size` ids."""
    start = await start_of(world)
    ids = [await world.stub_payment(f"stray-{i}") for i in range(12)]
    report = await world.reconcile(await window_until_now(world, start), sample_size=5)
    assert report.counts["movement_without_attempt"] == 12
    assert report.samples["movement_without_attempt"] == sorted(ids)[:5]


async def test_open_or_invalid_window_is_refused(world: World) -> None:
    """A window that has not closed yet, or is empty, is refused rather than half-checked."""
    now = await world.db_now()
    with pytest.raises(WindowNotClosed):
        await world.reconcile(Window(start=now, end=now + timedelta(hours=1)))
    with pytest.raises(InvalidWindow):
        await world.reconcile(Window(start=now, end=now))


async def test_abandoned_payout_the_rail_settled_is_abandoned_but_settled(world: World) -> None:
    """An operator abandons an ambiguous payout whose instruction the real stub did record (its
    500 came after the movement): the money left, the ledger says nothing moved. That is the
    operator's accepted risk, reported as its own class and not as a submission without ledger."""
    start = await start_of(world)
    payout_id = await world.pay(2077)  # the stub records the movement, then answers 500
    token = world.next_token()
    await world.store.abandon(payout_id, token, world.ctx, operator="ops-1", reason="SLA passed")
    report = await world.reconcile(await window_until_now(world, start))
    assert report.counts == only(report.counts, "abandoned_but_settled")
    assert report.samples["abandoned_but_settled"] == [payout_id]
