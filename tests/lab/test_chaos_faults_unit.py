"""Unit tests of the injector's rail-window orchestration, with a MOCKED rail stub (httpx
MockTransport) and no stack: what it sends, and what it records when the stub lacks a knob. The
real stub and stack are exercised by the chaos runs (test_chaos_runs.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from lab.chaos.faults import FaultInjector
from lab.chaos.rail import RAIL_BASELINE, RailFaults
from lab.chaos.schedule import Fault
from stack.system import Stack


def injector_with_mock_stub(echo_clock_skew: bool) -> tuple[RailFaults, list[dict[str, Any]]]:
    """An injector whose rail stub is a mock: it records every behaviour patch and echoes the
    merged behaviour back, with `clock_skew_s` only if `echo_clock_skew` (a stub with the knob)."""
    sent: list[dict[str, Any]] = []
    behaviour: dict[str, Any] = dict(RAIL_BASELINE)

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer op-token"
        patch = json.loads(request.content)
        sent.append(patch)
        behaviour.update({k: v for k, v in patch.items() if k != "clock_skew_s" or echo_clock_skew})
        return httpx.Response(200, json=behaviour)

    operator = {"Authorization": "Bearer op-token"}
    stack = cast(
        Stack,
        SimpleNamespace(railstub_url="http://stub.invalid", operator_headers=lambda: operator),
    )
    inj = FaultInjector(
        stack, worker_env={}, lease_s=3.0, progress=lambda _s: None, submit_deadline_s=90.0
    )
    # The harness steers the stub as the stack's operator: every call carries its credential.
    # (the headers are those FaultInjector built its own client with, from the stack)
    rail = inj.rail_faults
    built = rail.http.headers
    rail.http = httpx.AsyncClient(transport=httpx.MockTransport(handle), headers=built)
    return rail, sent


async def test_clock_skew_on_a_stub_without_the_knob_is_recorded_as_not_applied() -> None:
    """The stub drops the unknown field (200 without it): not applied, no window, run goes on."""
    inj, sent = injector_with_mock_stub(echo_clock_skew=False)
    record = await inj.clock_skew(Fault(1, "clock_skew", 0.0, duration_s=0.01, level=-12.5))
    assert record == {"clock_skew_s": -12.5, "applied": False}
    assert sent == [{"clock_skew_s": -12.5}]


async def test_clock_skew_on_a_stub_with_the_knob_is_applied_then_reset() -> None:
    """The stub echoes the offset: applied for the window, then set back to 0."""
    inj, sent = injector_with_mock_stub(echo_clock_skew=True)
    record = await inj.clock_skew(Fault(1, "clock_skew", 0.0, duration_s=0.01, level=7.0))
    assert record["applied"] is True and record["clock_skew_s"] == 7.0
    assert sent == [{"clock_skew_s": 7.0}, {"clock_skew_s": 0.0}]


async def test_rail_slow_latency_exceeds_the_submit_deadline_and_is_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Latency = submit deadline + the fault's level, for the window; then the baseline's."""
    inj, sent = injector_with_mock_stub(echo_clock_skew=False)
    ids = iter([10, 12, 12])  # before the window, then two submissions recorded in it

    async def last_attempt_id() -> int:
        return next(ids)

    monkeypatch.setattr(inj.attempts, "last_attempt_id", last_attempt_id)
    record = await inj.slow(Fault(1, "rail_slow", 0.0, duration_s=0.01, level=4.5))
    assert sent == [
        {"latency_mode": "fixed", "latency_fixed_ms": 94_500},
        {"latency_fixed_ms": RAIL_BASELINE["latency_fixed_ms"]},
    ]
    assert record["slowed_attempts"] == 2 and record["submit_deadline_s"] == 90.0
