"""The rail stub: deterministic behaviour decisions (unit), non-idempotence and lookups (live)."""

from __future__ import annotations

import random
import statistics

import httpx

from railstub import Action, Behaviour, Rule
from railstub.behaviour import decide
from tests.rail import Stub
from tests.waiting import wait_for


def test_unit_rules_decide_deterministically() -> None:
    """The first matching rule (amount suffix or reference prefix) decides; outage beats rules."""
    b = Behaviour(
        rules=[
            Rule(amount_suffix="13", action=Action.DECLINE),
            Rule(reference_prefix="t-", action=Action.TIMEOUT_AFTER, latency_ms=7),
        ],
        ambiguity_rate=0.0,
    )
    rng = random.Random(1)
    assert decide(b, rng, 1013, "x")[0] is Action.DECLINE
    assert decide(b, rng, 1000, "t-1") == (Action.TIMEOUT_AFTER, 0.007)
    assert decide(b, rng, 1000, "x")[0] is Action.SETTLE
    assert decide(b.model_copy(update={"outage": True}), rng, 1013, "x")[0] is Action.UNAVAILABLE


def test_unit_random_choices_are_reproducible_from_the_seed() -> None:
    """Two generators with the same seed give the same actions and latencies."""
    b = Behaviour(ambiguity_rate=0.2, decline_rate=0.2, delayed_rate=0.2)
    rngs = [random.Random(42), random.Random(42)]
    runs = [[decide(b, rng, 1000, f"r{i}") for i in range(50)] for rng in rngs]
    assert runs[0] == runs[1]
    assert {a for a, _ in runs[0]} >= {Action.SETTLE, Action.AMBIGUOUS}


def test_unit_lognormal_latency_fits_p50_and_p99() -> None:
    """The default latency model has a median near 300 ms and a 99th percentile near 3 s (A-07)."""
    rng = random.Random(3)
    b = Behaviour()
    samples = sorted(decide(b, rng, 1, "r")[1] for _ in range(20_000))
    assert 0.27 < statistics.median(samples) < 0.33
    assert 2.5 < samples[int(len(samples) * 0.99)] < 3.6


async def test_stub_is_not_idempotent(stub: Stub) -> None:
    """The same client reference submitted twice is two movements (the duplicate evidence)."""
    async with httpx.AsyncClient(base_url=stub.url) as c:
        for _ in range(2):
            r = await c.post(
                "/payments", json={"client_reference": "same", "account_id": "a", "amount": 5}
            )
            assert r.json()["status"] == "settled"
    assert (await stub.counts()) == {"same": 2}


async def test_lookup_is_eventually_consistent(stub: Stub) -> None:
    """A movement is invisible to lookup until the visibility delay passes, then settled."""
    await stub.set(visibility_delay_s=0.3)
    async with httpx.AsyncClient(base_url=stub.url) as c:
        await c.post("/payments", json={"client_reference": "vis", "account_id": "a", "amount": 5})
        first = (await c.get("/lookup", params={"client_reference": "vis"})).json()["status"]

        async def visible() -> bool:
            r = await c.get("/lookup", params={"client_reference": "vis"})
            return bool(r.json()["status"] == "settled")

        await wait_for(visible)
    assert first == "not_found"


async def test_delayed_completion_goes_pending_then_settled(stub: Stub) -> None:
    """A delayed payment answers 202 pending and the lookup later reports it settled."""
    await stub.set(rules=[{"reference_prefix": "dl-", "action": "delayed"}])
    async with httpx.AsyncClient(base_url=stub.url) as c:
        r = await c.post(
            "/payments", json={"client_reference": "dl-1", "account_id": "a", "amount": 5}
        )
        assert (r.status_code, r.json()["status"]) == (202, "pending")

        async def settled() -> bool:
            r = await c.get("/lookup", params={"client_reference": "dl-1"})
            return bool(r.json()["status"] == "settled")

        await wait_for(settled)


async def test_unavailable_and_invalid_requests_record_nothing(stub: Stub) -> None:
    """An outage answers 503 NOT_ACCEPTED and an invalid body 422; neither records a movement."""
    async with httpx.AsyncClient(base_url=stub.url) as c:
        bad = await c.post(
            "/payments", json={"client_reference": "x", "account_id": "a", "amount": 0}
        )
        assert bad.status_code == 422
        await stub.set(outage=True)
        r = await c.post(
            "/payments", json={"client_reference": "x", "account_id": "a", "amount": 5}
        )
        assert (r.status_code, r.json()["code"]) == (503, "NOT_ACCEPTED")
    assert await stub.movements() == []


async def test_admin_behaviour_is_validated_and_reset_restores_startup(stub: Stub) -> None:
    """An inconsistent behaviour patch is refused; reset restores start-up behaviour and the log."""
    async with httpx.AsyncClient(base_url=stub.url) as c:
        r = await c.post("/admin/behaviour", json={"latency_p50_ms": 5000})  # above p99
        assert r.status_code == 422
        await stub.set(outage=True)
        await c.post("/admin/reset")
        assert (await c.get("/admin/behaviour")).json()["outage"] is False
