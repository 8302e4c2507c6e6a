"""Unit tests of the hand-written gates of railproxy.resilience (issue 30): the circuit breaker's
state transitions, the token bucket's limits and refill, the bulkhead's concurrency and queue
bounds, and the health evidence. A fake monotonic clock replaces `time` in that module only.

The figures docs/rail.md derives from the breaker's settings ("how many failing calls the rail
sees before every replica's breaker is open") are checked here against the real breaker.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from railproxy import resilience
from railproxy.errors import AdmissionFull, CircuitOpen, DeadlineExceeded, RateLimited
from railproxy.resilience import (
    Bulkhead,
    CircuitBreaker,
    CircuitState,
    Evidence,
    TokenBucket,
    Transition,
)
from railproxy.settings import ProxySettings


class FakeClock:
    """Stands in for the `time` module of railproxy.resilience: `monotonic` moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(resilience, "time", fake)
    return fake


def _breaker(transitions: list[Transition] | None = None, **kw: float) -> CircuitBreaker:
    settings: dict[str, float] = {
        "window": 20,
        "min_samples": 5,
        "failure_ratio": 0.5,
        "open_s": 5.0,
    } | kw
    return CircuitBreaker(
        window=int(settings["window"]),
        min_samples=int(settings["min_samples"]),
        failure_ratio=settings["failure_ratio"],
        open_s=settings["open_s"],
        on_transition=None if transitions is None else transitions.append,
    )


def failures_until_open(breaker: CircuitBreaker) -> int:
    """Failed results the breaker records before it opens (every call failing from now on)."""
    n = 0
    while breaker.state is CircuitState.CLOSED:
        breaker.record(False)
        n += 1
    return n


# ----------------------------------------------------------------------------- circuit breaker


def test_breaker_stays_closed_below_min_samples_then_opens_on_the_ratio(clock: FakeClock) -> None:
    """Four failures of four are below the minimum sample count; the fifth opens the circuit."""
    seen: list[Transition] = []
    breaker = _breaker(seen)
    for _ in range(4):
        breaker.record(False)
        breaker.check()  # still admitted
    breaker.record(False)
    assert breaker.state is CircuitState.OPEN
    assert [(t.from_state, t.to_state) for t in seen] == [(CircuitState.CLOSED, CircuitState.OPEN)]
    assert "5/5" in seen[0].reason
    with pytest.raises(CircuitOpen):
        breaker.check()


def test_breaker_counts_the_ratio_over_a_sliding_window(clock: FakeClock) -> None:
    """Old results slide out: 9 failures among the last 20 stay closed, the 10th opens."""
    breaker = _breaker()
    for _ in range(20):
        breaker.record(True)
    for _ in range(9):
        breaker.record(False)
    assert breaker.state is CircuitState.CLOSED  # 9/20 < 0.5
    for _ in range(20):  # successes push the failures out of the window again
        breaker.record(True)
    assert list(breaker.window).count(False) == 0
    assert failures_until_open(breaker) == 10  # 10/20 >= 0.5


@pytest.mark.parametrize(
    ("window", "min_samples", "ratio"), [(20, 5, 0.5), (10, 3, 0.4), (7, 7, 1.0)]
)
def test_failures_to_open_are_between_min_samples_and_ratio_times_window(
    clock: FakeClock, window: int, min_samples: int, ratio: float
) -> None:
    """The bound docs/rail.md uses: a breaker opens after at most ceil(ratio * window) failed
    results (from a window full of successes), and after min_samples from an empty window."""
    worst = _breaker(window=window, min_samples=min_samples, failure_ratio=ratio)
    for _ in range(window):
        worst.record(True)
    assert failures_until_open(worst) == math.ceil(ratio * window)
    fresh = _breaker(window=window, min_samples=min_samples, failure_ratio=ratio)
    assert failures_until_open(fresh) == min_samples


def test_results_while_not_closed_do_not_move_the_state(clock: FakeClock) -> None:
    """Answers of calls admitted before the circuit opened change nothing while it is open."""
    breaker = _breaker()
    failures_until_open(breaker)
    for _ in range(50):
        breaker.record(True)
    assert breaker.state is CircuitState.OPEN


def test_open_goes_half_open_only_after_open_s_and_a_probe_decides(clock: FakeClock) -> None:
    """OPEN -> HALF_OPEN after open_s; a failed probe reopens (and restarts the interval), a
    successful one closes with an empty window. HALF_OPEN admits no submission."""
    seen: list[Transition] = []
    breaker = _breaker(seen)
    failures_until_open(breaker)
    clock.now += 4.9
    assert not breaker.probe_due()
    clock.now += 0.1
    assert breaker.probe_due()
    breaker.start_probe()
    assert breaker.state is CircuitState.HALF_OPEN
    assert not breaker.probe_due()
    with pytest.raises(CircuitOpen):
        breaker.check()
    breaker.probe_result(False, "HTTP 503")
    # A fresh read: mypy kept `breaker.state` narrowed to HALF_OPEN from the assert above.
    reopened: CircuitState = breaker.state
    assert reopened is CircuitState.OPEN
    clock.now += 4.9
    assert not breaker.probe_due()  # the interval restarted at the failed probe
    clock.now += 0.1
    breaker.start_probe()
    breaker.probe_result(True, "HTTP 200")
    closed: CircuitState = breaker.state
    assert closed is CircuitState.CLOSED
    assert len(breaker.window) == 0
    breaker.check()
    assert [t.to_state for t in seen] == [
        CircuitState.OPEN,
        CircuitState.HALF_OPEN,
        CircuitState.OPEN,
        CircuitState.HALF_OPEN,
        CircuitState.CLOSED,
    ]
    assert failures_until_open(breaker) == 5  # a fresh window: min_samples again


def test_breaker_history_is_bounded(clock: FakeClock) -> None:
    breaker = _breaker()
    for _ in range(40):
        failures_until_open(breaker)
        breaker.start_probe()
        breaker.probe_result(True, "ok")
    assert len(breaker.history) == 50
    assert breaker.history[-1].to_state is CircuitState.CLOSED


def test_settings_refuse_a_breaker_that_could_never_open() -> None:
    """min_samples above the window: the window never holds enough samples to open."""
    with pytest.raises(ValueError, match="BREAKER_MIN_SAMPLES"):
        ProxySettings(breaker_window=4, breaker_min_samples=5)
    assert ProxySettings(breaker_window=5, breaker_min_samples=5).breaker_window == 5


# -------------------------------------------------------------------------------- token bucket


def test_bucket_admits_a_burst_then_refuses(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    for _ in range(3):
        bucket.take()
    assert bucket.throttling
    with pytest.raises(RateLimited):
        bucket.take()


def test_bucket_refills_at_its_rate_and_never_above_its_burst(clock: FakeClock) -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    for _ in range(3):
        bucket.take()
    clock.now += 0.4  # 0.8 token: not yet one
    with pytest.raises(RateLimited):
        bucket.take()
    clock.now += 0.1  # 0.8 + 0.2 = 1 token
    assert not bucket.throttling
    bucket.take()
    clock.now += 3600  # refills to the burst, not beyond
    for _ in range(3):
        bucket.take()
    with pytest.raises(RateLimited):
        bucket.take()


def test_bucket_bounds_any_window_by_burst_plus_rate(clock: FakeClock) -> None:
    """Offered far above the rate for 10 s, the bucket admits at most burst + rate * 10."""
    bucket = TokenBucket(rate=4.0, burst=4)
    admitted = 0
    for step in range(641):  # t = 0 .. 10 s in steps of 1/64 s (no rounding in the refill)
        clock.now = 1000.0 + step / 64
        for _ in range(10):  # offered 640/s
            try:
                bucket.take()
                admitted += 1
            except RateLimited:
                pass
    assert admitted == 4 + 4 * 10


# ------------------------------------------------------------------------------------ bulkhead


async def test_bulkhead_holds_at_most_its_concurrency_and_queues_the_rest() -> None:
    bulkhead = Bulkhead(max_concurrency=2, max_queue=1)
    release = asyncio.Event()
    peak = 0

    async def call() -> None:
        nonlocal peak
        async with bulkhead.slot(wait_s=30):
            peak = max(peak, bulkhead.in_flight)
            await release.wait()

    tasks = [asyncio.create_task(call()) for _ in range(3)]
    while bulkhead.queued < 1:
        await asyncio.sleep(0)
    assert (bulkhead.in_flight, bulkhead.queued, bulkhead.state) == (2, 1, "REJECTING")
    with pytest.raises(AdmissionFull):
        async with bulkhead.slot(wait_s=30):
            pass
    release.set()
    await asyncio.gather(*tasks)
    assert peak == 2
    assert (bulkhead.in_flight, bulkhead.queued, bulkhead.state) == (0, 0, "ACCEPTING")


async def test_bulkhead_queue_wait_ends_at_its_deadline() -> None:
    """A queued call whose wait runs out is DeadlineExceeded and leaves the queue."""
    bulkhead = Bulkhead(max_concurrency=1, max_queue=4)
    async with bulkhead.slot(wait_s=1):
        assert bulkhead.state == "QUEUEING"
        with pytest.raises(DeadlineExceeded):
            async with bulkhead.slot(wait_s=0.01):
                pass
        assert bulkhead.queued == 0
    assert bulkhead.in_flight == 0


async def test_bulkhead_frees_the_slot_when_the_call_raises_and_wakes_a_waiter() -> None:
    bulkhead = Bulkhead(max_concurrency=1, max_queue=1)
    entered = asyncio.Event()

    async def failing() -> None:
        async with bulkhead.slot(wait_s=1):
            entered.set()
            await asyncio.sleep(0)
            raise RuntimeError("the call failed")

    async def waiting() -> int:
        async with bulkhead.slot(wait_s=30):
            return bulkhead.in_flight

    first = asyncio.create_task(failing())
    await entered.wait()
    second = asyncio.create_task(waiting())
    with pytest.raises(RuntimeError):
        await first
    assert await second == 1
    assert bulkhead.in_flight == 0


async def test_bulkhead_with_no_queue_rejects_at_once() -> None:
    bulkhead = Bulkhead(max_concurrency=1, max_queue=0)
    async with bulkhead.slot(wait_s=1):
        assert bulkhead.state == "REJECTING"
        with pytest.raises(AdmissionFull):
            async with bulkhead.slot(wait_s=1):
                pass


# ------------------------------------------------------------------------------------ evidence


def test_evidence_is_bounded_and_summarises_recent_forwards(clock: FakeClock) -> None:
    evidence = Evidence(size=4)
    assert evidence.summary()["samples"] == 0 and evidence.summary()["error_ratio"] is None
    for latency, ok, timeout in [
        (9.0, False, True),
        (0.1, True, False),
        (0.2, True, False),
        (0.3, False, False),
        (0.4, True, False),
    ]:
        evidence.add(latency, ok=ok, timeout=timeout)
    summary = evidence.summary()
    assert summary["samples"] == 4  # the oldest (the 9 s timeout) slid out
    assert summary["error_ratio"] == 0.25 and summary["timeout_ratio"] == 0.0
    assert summary["latency_p50_s"] == 0.3
    assert evidence.last_success_at is not None
