"""The absence rule at the proxy: a rail `not_found` proves an attempt absent only when the rail's
window covers it with the Connection's margins (unit: the pure rule; live: real stub, real
proxy, real PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TypedDict

import httpx

from railproxy import Outcome
from railproxy.absence import judge
from railproxy.models import AttemptRecord, LookupResponse
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, submit_request
from tests.waiting import wait_for

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Margins(TypedDict):
    """`judge`'s keyword-only margins."""

    ingest_bound_s: float
    skew_margin_s: float


def _attempt(outcome: Outcome | None = Outcome.UNKNOWN, *, deadline_s: float = 10) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=1,
        payout_id="p",
        account_id="a",
        amount=1,
        client_reference="r",
        token=1,
        correlation_id="c",
        causation_id="c",
        deadline_at=T0 + timedelta(seconds=deadline_s),
        adapter_version="v",
        contract_version="v",
        connection_id="x",
        fencing_enforced=True,
        guard_bypassed=False,
        outcome=outcome,
        rail_status=None,
        rail_movement_id=None,
        error_class=None,
        recorded_at=T0,
        completed_at=None,
    )


def _window(from_s: float, through_s: float) -> tuple[datetime, datetime]:
    return T0 + timedelta(seconds=from_s), T0 + timedelta(seconds=through_s)


def test_unit_absence_needs_the_window_to_cover_the_attempt_with_both_margins() -> None:
    """Deadline 10 s after recording, ingest bound 60, skew 30: through must reach +100 and from
    must precede -30; a hair short on either side proves nothing."""
    margins: Margins = {"ingest_bound_s": 60.0, "skew_margin_s": 30.0}
    assert judge([_attempt()], *_window(-30, 100), **margins).absent
    assert not judge([_attempt()], *_window(-30, 99.999), **margins).absent
    assert "records begin" in judge([_attempt()], *_window(-29.999, 1000), **margins).reason


def test_unit_absence_is_never_claimed_without_attempts_window_or_against_an_answer() -> None:
    """No recorded attempt, no stated window, or an attempt the rail answered: never absent."""
    wide = _window(-1000, 1000)
    zero: Margins = {"ingest_bound_s": 0.0, "skew_margin_s": 0.0}
    assert not judge([], *wide, **zero).absent
    assert not judge([_attempt()], None, wide[1], **zero).absent
    assert not judge([_attempt()], wide[0], None, **zero).absent
    assert not judge([_attempt(Outcome.ACKED)], *wide, **zero).absent
    assert not judge([_attempt(), _attempt(Outcome.DECLINED)], *wide, **zero).absent


def test_unit_zero_margins_are_the_old_rule() -> None:
    """Both margins 0: complete_through >= deadline_at is enough (the negative controls' rule)."""
    zero: Margins = {"ingest_bound_s": 0.0, "skew_margin_s": 0.0}
    assert judge([_attempt(None)], *_window(0, 10), **zero).absent
    assert not judge([_attempt(None)], *_window(0, 9.999), **zero).absent


async def _log_older_than(stub: Stub, seconds: float) -> None:
    """Wait until the stub's own statement says its records began `seconds` ago (on its clock)."""

    async def old_enough() -> bool:
        async with httpx.AsyncClient(base_url=stub.url, timeout=5) as c:
            data = (await c.get("/lookup", params={"client_reference": "age"})).json()
        window = datetime.fromisoformat(data["complete_through"]) - datetime.fromisoformat(
            data["complete_from"]
        )
        return window.total_seconds() >= seconds

    await wait_for(old_enough, timeout_s=30)


async def test_not_found_is_absent_only_once_the_window_passes_deadline_and_margins(
    make_proxy: MakeProxy, stub: Stub
) -> None:
    """An instruction lost before the rail: lookups right after the deadline do not prove it
    absent; once the rail's complete_through passes deadline + ingest bound + skew margin they
    do, by payout and by reference alike."""
    proxy = await make_proxy(absence_ingest_bound_s=2.0, absence_clock_skew_margin_s=1.0)
    await stub.set(rules=[{"reference_prefix": "tb-", "action": "timeout_before"}])
    await _log_older_than(stub, 1.5)  # else its records could begin after us on a skewed clock
    req = submit_request(reference=f"tb-{uuid.uuid4().hex[:8]}", deadline_s=1.0)
    await proxy.client.submit(req)
    [attempt] = await proxy.client.get_attempts(req.payout_id)
    needed = attempt.deadline_at + timedelta(seconds=3.0)
    seen: list[LookupResponse] = []

    async def proven() -> bool:
        seen.append(await proxy.client.lookup(req.client_reference, payout_id=req.payout_id))
        return seen[-1].absent

    await wait_for(proven, timeout_s=30)
    by_reference = await proxy.client.lookup(req.client_reference)
    assert {r.status for r in seen} == {"not_found"}
    assert not seen[0].absent and "not yet" in seen[0].reason
    for r in seen:
        assert r.complete_through is not None
        assert r.absent == (r.complete_through >= needed), r
    assert by_reference.absent
    assert await stub.movements(req.client_reference) == []


async def test_rail_records_beginning_after_the_attempt_never_prove_it_absent(
    make_proxy: MakeProxy, stub: Stub
) -> None:
    """Even with both margins 0, a rail whose log began after the attempt (a reset, a forgetful
    restart) never proves it absent; an attempt made after the reset is proven by the same rule."""
    proxy = await make_proxy(absence_ingest_bound_s=0.0, absence_clock_skew_margin_s=0.0)
    rules = [{"reference_prefix": "tb-", "action": "timeout_before"}]
    await stub.set(rules=rules)
    before = submit_request(reference=f"tb-{uuid.uuid4().hex[:8]}", deadline_s=0.6)
    await proxy.client.submit(before)
    await stub.reset()  # the rail forgets: its records now begin after `before` was attempted
    await stub.set(rules=rules)
    after = submit_request(reference=f"tb-{uuid.uuid4().hex[:8]}", deadline_s=0.6)
    await proxy.client.submit(after)

    async def after_proven() -> bool:
        found = await proxy.client.lookup(after.client_reference, payout_id=after.payout_id)
        return found.absent

    await wait_for(after_proven, timeout_s=30)
    forgotten = await proxy.client.lookup(before.client_reference, payout_id=before.payout_id)
    [attempt] = await proxy.client.get_attempts(before.payout_id)
    assert forgotten.status == "not_found"
    assert forgotten.complete_through is not None and forgotten.complete_from is not None
    assert forgotten.complete_through >= attempt.deadline_at  # the old rule would say absent
    assert forgotten.complete_from > attempt.recorded_at
    assert not forgotten.absent and "records begin" in forgotten.reason
