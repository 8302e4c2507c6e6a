"""The proxy against rail faults: each outcome gets the right handoff certainty, and under every
fault the stub's movement log shows no client reference that reached the rail twice."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import structlog

from railproxy import HandoffCertainty, Outcome
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, Proxy, submit_request
from tests.waiting import wait_for


async def test_business_decline_is_final(proxy: Proxy, stub: Stub) -> None:
    """A rail decline is recorded as DECLINED with certainty FINAL, and lookup reports it."""
    await stub.set(rules=[{"amount_suffix": "13", "action": "decline"}])
    req = submit_request(amount=1013)
    result = await proxy.client.submit(req)
    assert (result.outcome, result.handoff_certainty) == (Outcome.DECLINED, HandoffCertainty.FINAL)
    [attempt] = await proxy.client.get_attempts(req.payout_id)
    assert attempt.outcome is Outcome.DECLINED
    assert (await proxy.client.lookup(req.client_reference)).status == "declined"
    await stub.assert_no_duplicates()


async def test_timeout_after_handoff_is_unknown_and_rail_has_it(proxy: Proxy, stub: Stub) -> None:
    """A stall after the rail recorded the movement gives UNKNOWN; the lookup finds it settled."""
    await stub.set(rules=[{"reference_prefix": "tafter-", "action": "timeout_after"}])
    req = submit_request(reference=f"tafter-{uuid.uuid4().hex[:8]}")
    result = await proxy.client.submit(req)
    assert result.handoff_certainty is HandoffCertainty.UNKNOWN
    assert result.http_status == 202
    [attempt] = await proxy.client.get_attempts(req.payout_id)
    assert attempt.outcome is Outcome.UNKNOWN
    assert len(await stub.movements(req.client_reference)) == 1
    assert (await proxy.client.lookup(req.client_reference)).status == "settled"
    await stub.assert_no_duplicates()


async def test_ambiguous_error_after_recording_is_unknown(proxy: Proxy, stub: Stub) -> None:
    """A 500 after the rail recorded the movement is UNKNOWN, never NOT_SUBMITTED."""
    await stub.set(rules=[{"amount_suffix": "77", "action": "ambiguous"}])
    req = submit_request(amount=177)
    result = await proxy.client.submit(req)
    assert result.handoff_certainty is HandoffCertainty.UNKNOWN
    assert len(await stub.movements(req.client_reference)) == 1
    await stub.assert_no_duplicates()


async def test_stall_before_recording_is_still_unknown(proxy: Proxy, stub: Stub) -> None:
    """A read timeout is UNKNOWN even when the rail recorded nothing: the proxy cannot know."""
    await stub.set(rules=[{"reference_prefix": "tbefore-", "action": "timeout_before"}])
    req = submit_request(reference=f"tbefore-{uuid.uuid4().hex[:8]}")
    result = await proxy.client.submit(req)
    assert result.handoff_certainty is HandoffCertainty.UNKNOWN
    assert await stub.movements(req.client_reference) == []
    assert (await proxy.client.lookup(req.client_reference)).status == "not_found"


async def test_refused_connection_is_not_submitted_and_frees_the_payout(
    make_proxy: MakeProxy, stub: Stub, closed_port: int
) -> None:
    """Connection refused is authoritative NOT_SUBMITTED; a later attempt for the payout may go."""
    dead = await make_proxy(rail_url=f"http://127.0.0.1:{closed_port}")
    req = submit_request()
    result = await dead.client.submit(req)
    assert result.code == "RAIL_UNAVAILABLE"
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    [attempt] = await dead.client.get_attempts(req.payout_id)
    assert (attempt.outcome, attempt.error_class) == (Outcome.NOT_SUBMITTED, "ConnectError")
    live = await make_proxy()
    assert (await live.client.submit(req)).outcome is Outcome.ACKED
    assert len(await stub.movements(req.client_reference)) == 1
    await stub.assert_no_duplicates()


async def test_connect_timeout_is_not_submitted(
    make_proxy: MakeProxy, full_backlog_port: int
) -> None:
    """A connect that never completes (full accept backlog) is NOT_SUBMITTED, not UNKNOWN."""
    proxy = await make_proxy(rail_url=f"http://127.0.0.1:{full_backlog_port}")
    req = submit_request()
    result = await proxy.client.submit(req)
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    [attempt] = await proxy.client.get_attempts(req.payout_id)
    assert (attempt.outcome, attempt.error_class) == (Outcome.NOT_SUBMITTED, "ConnectTimeout")


async def test_provider_outage_503_is_not_submitted(proxy: Proxy, stub: Stub) -> None:
    """An explicit 503 NOT_ACCEPTED from the rail is NOT_SUBMITTED and nothing moved."""
    await stub.set(outage=True)
    req = submit_request()
    result = await proxy.client.submit(req)
    assert (result.code, result.handoff_certainty) == (
        "RAIL_UNAVAILABLE",
        HandoffCertainty.NOT_SUBMITTED,
    )
    assert await stub.movements() == []


async def test_deadline_already_passed_records_nothing(proxy: Proxy, stub: Stub) -> None:
    """No useful budget left: DEADLINE_EXCEEDED before any attempt is recorded."""
    req = submit_request(deadline_s=-1)
    result = await proxy.client.submit(req)
    assert (result.code, result.http_status) == ("DEADLINE_EXCEEDED", 504)
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert await proxy.client.get_attempts(req.payout_id) == []
    assert await stub.movements() == []


async def test_caller_deadline_bounds_the_forward(make_proxy: MakeProxy, stub: Stub) -> None:
    """With a rail timeout far beyond the caller's deadline, the deadline ends the forward."""
    proxy = await make_proxy(rail_timeout_s=60)
    await stub.set(rules=[{"reference_prefix": "tafter-", "action": "timeout_after"}])
    req = submit_request(reference=f"tafter-{uuid.uuid4().hex[:8]}", deadline_s=0.5)
    result = await proxy.client.submit(req)  # the client's own timeout is deadline + margin
    assert result.handoff_certainty is HandoffCertainty.UNKNOWN
    assert result.code is None  # the proxy answered: it gave up at the deadline, not the client


async def test_breaker_opens_then_closes_through_half_open(
    make_proxy: MakeProxy, stub: Stub
) -> None:
    """Failures open the breaker; read-only probes fail then succeed; submits resume after."""
    proxy = await make_proxy(breaker_min_samples=3, breaker_window=3, breaker_failure_ratio=1.0)
    await stub.set(outage=True)
    for _ in range(3):
        assert (await proxy.client.submit(submit_request())).code == "RAIL_UNAVAILABLE"
    rejected_req = submit_request()
    rejected = await proxy.client.submit(rejected_req)
    assert (rejected.code, rejected.http_status) == ("CIRCUIT_OPEN", 503)
    assert await proxy.client.get_attempts(rejected_req.payout_id) == []
    # STD01-08: an UNAVAILABLE Connection answers its health check with 503, not 200.
    async with httpx.AsyncClient(base_url=proxy.url) as http:
        unavailable = await http.get("/health")
    assert unavailable.status_code == 503
    assert unavailable.json()["health_state"] == "UNAVAILABLE"

    async def probe_failed_once() -> bool:
        history = (await proxy.health())["circuit_history"]
        return any(t["from"] == "HALF_OPEN" and t["to"] == "OPEN" for t in history)

    await wait_for(probe_failed_once)
    await stub.set(outage=False)

    async def closed() -> bool:
        return bool((await proxy.health())["circuit_state"] == "CLOSED")

    await wait_for(closed)
    assert (await proxy.client.submit(submit_request())).outcome is Outcome.ACKED
    history = [(t["from"], t["to"]) for t in (await proxy.health())["circuit_history"]]
    assert history[0] == ("CLOSED", "OPEN")
    assert history[-1] == ("HALF_OPEN", "CLOSED")
    assert ("HALF_OPEN", "OPEN") in history
    assert all(b == "HALF_OPEN" for a, b in history if a == "OPEN")  # OPEN only leaves via probe
    # Probes were read-only lookups: the rail saw them, and they never became movements.
    assert await stub.lookups() > 0
    assert all(
        not m["client_reference"].startswith("railproxy-probe") for m in await stub.movements()
    )
    assert len(await stub.movements()) == 1
    await stub.assert_no_duplicates()


async def test_full_bulkhead_rejects_with_admission_full(make_proxy: MakeProxy, stub: Stub) -> None:
    """One slot and a queue of one: the third concurrent submit is ADMISSION_FULL, not recorded."""
    proxy = await make_proxy(max_concurrency=1, max_queue=1, rail_timeout_s=5)
    await stub.set(rules=[{"reference_prefix": "slow-", "latency_ms": 800}])
    first = submit_request(reference=f"slow-{uuid.uuid4().hex[:8]}")
    second = submit_request(reference=f"slow-{uuid.uuid4().hex[:8]}")
    task_a = asyncio.create_task(proxy.client.submit(first))
    await wait_for(lambda: _health_is(proxy, in_flight=1))
    task_b = asyncio.create_task(proxy.client.submit(second))
    await wait_for(lambda: _health_is(proxy, queued=1))
    assert (await proxy.health())["admission_state"] == "REJECTING"
    third_req = submit_request()
    third = await proxy.client.submit(third_req)
    assert (third.code, third.handoff_certainty) == (
        "ADMISSION_FULL",
        HandoffCertainty.NOT_SUBMITTED,
    )
    assert await proxy.client.get_attempts(third_req.payout_id) == []
    assert (await task_a).outcome is Outcome.ACKED
    assert (await task_b).outcome is Outcome.ACKED
    assert await stub.movements(third_req.client_reference) == []
    await stub.assert_no_duplicates()


async def _health_is(proxy: Proxy, **expected: int) -> bool:
    health = await proxy.health()
    return all(health[k] == v for k, v in expected.items())


async def test_rate_limit_rejects_before_recording(make_proxy: MakeProxy, stub: Stub) -> None:
    """An empty token bucket gives RATE_LIMITED (429) and records nothing."""
    proxy = await make_proxy(rate_per_s=0.001, rate_burst=1)
    assert (await proxy.client.submit(submit_request())).outcome is Outcome.ACKED
    req = submit_request()
    limited = await proxy.client.submit(req)
    assert (limited.code, limited.http_status) == ("RATE_LIMITED", 429)
    assert await proxy.client.get_attempts(req.payout_id) == []
    assert (await proxy.health())["admission_state"] == "THROTTLED"


async def test_stale_token_emits_events_and_counter(proxy: Proxy, stub: Stub) -> None:
    """A stale token emits rail.rejected and lock.fenced_out with both tokens, and counts it."""
    account = f"a-{uuid.uuid4().hex[:8]}"
    await proxy.client.submit(submit_request(account_id=account, token=8))
    with structlog.testing.capture_logs() as events:
        await proxy.client.submit(submit_request(account_id=account, token=2))
    rejected = [e for e in events if e["event"] == "rail.rejected"]
    fenced = [e for e in events if e["event"] == "lock.fenced_out"]
    assert rejected[0]["code"] == "STALE_TOKEN"
    assert (rejected[0]["presented_token"], rejected[0]["highest_token"]) == (2, 8)
    assert fenced[0]["key"] == f"payout:{account}"
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{proxy.url}/metrics")).text
    assert 'railproxy_rejections_total{code="STALE_TOKEN"} 1.0' in text


async def test_metrics_carry_no_identifiers(proxy: Proxy, stub: Stub) -> None:
    """/metrics exposes the required series without any payout, account, reference or token."""
    req = submit_request(token=424242)
    await proxy.client.submit(req)
    await proxy.client.submit(req)  # a duplicate rejection, so rejection series exist too
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{proxy.url}/metrics")).text
    for series in (
        "railproxy_submit_requests_total",
        "railproxy_submit_outcomes_total",
        "railproxy_rejections_total",
        "railproxy_forward_seconds_bucket",
        "railproxy_circuit_state",
        "railproxy_in_flight",
    ):
        assert series in text
    for secret in (req.payout_id, req.account_id, req.client_reference, "424242"):
        assert secret not in text


async def test_health_reports_the_std01_08_fields(proxy: Proxy, stub: Stub) -> None:
    """/health has health_state, circuit/admission state, evidence, freshness and last success."""
    await proxy.client.submit(submit_request())
    health = await proxy.health()
    assert health["health_state"] == "AVAILABLE"
    assert (health["circuit_state"], health["admission_state"]) == ("CLOSED", "ACCEPTING")
    assert health["evidence"]["samples"] == 1
    assert health["last_success_at"] is not None
    assert health["valid_until"] > health["observed_at"]
