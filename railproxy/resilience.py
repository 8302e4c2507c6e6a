"""Resilience at the rail Connection boundary (STD01-08): breaker, bulkhead, rate limit, evidence.

All these gates reject BEFORE an attempt is recorded (and after the fence has taken the token:
see `railproxy.service`), so every rejection here is NOT_SUBMITTED.
Single event loop, no threads: plain attributes are enough, no locks needed except the bulkhead's
condition.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from railproxy.errors import AdmissionFull, CircuitOpen, DeadlineExceeded, RateLimited


class CircuitState(enum.StrEnum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


@dataclass(frozen=True)
class Transition:
    from_state: CircuitState
    to_state: CircuitState
    at: datetime
    reason: str


class CircuitBreaker:
    """Counts forward results over a sliding window; opens on a failure ratio over min samples.

    In HALF_OPEN, real submissions stay rejected: only the proxy's read-only probe (lookup or
    health call) may decide to close the circuit, so a probe can never move money.
    """

    def __init__(
        self,
        *,
        window: int,
        min_samples: int,
        failure_ratio: float,
        open_s: float,
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        self.on_transition = on_transition
        self.window: deque[bool] = deque(maxlen=window)
        self.min_samples = min_samples
        self.failure_ratio = failure_ratio
        self.open_s = open_s
        self.state = CircuitState.CLOSED
        self.opened_at = 0.0
        self.history: deque[Transition] = deque(maxlen=50)

    def check(self) -> None:
        """Raise CircuitOpen unless new submissions are admitted."""
        if self.state is not CircuitState.CLOSED:
            raise CircuitOpen(f"circuit is {self.state.value}; the rail is treated as unavailable")

    def record(self, success: bool) -> None:
        if self.state is not CircuitState.CLOSED:
            return  # results of calls admitted before opening do not move the state
        self.window.append(success)
        failures = self.window.count(False)
        if len(self.window) >= self.min_samples and failures / len(self.window) >= (
            self.failure_ratio
        ):
            self._move(CircuitState.OPEN, f"{failures}/{len(self.window)} forwards failed")

    def probe_due(self) -> bool:
        return self.state is CircuitState.OPEN and time.monotonic() - self.opened_at >= self.open_s

    def start_probe(self) -> None:
        self._move(CircuitState.HALF_OPEN, "open interval elapsed")

    def probe_result(self, success: bool, detail: str) -> None:
        if success:
            self.window.clear()
            self._move(CircuitState.CLOSED, f"probe succeeded: {detail}")
        else:
            self._move(CircuitState.OPEN, f"probe failed: {detail}")

    def _move(self, to: CircuitState, reason: str) -> None:
        transition = Transition(self.state, to, datetime.now(UTC), reason)
        self.history.append(transition)
        self.state = to
        if to is CircuitState.OPEN:
            self.opened_at = time.monotonic()
        if self.on_transition is not None:
            self.on_transition(transition)


class Bulkhead:
    """Bounded concurrency plus a bounded queue that rejects (ADMISSION_FULL) instead of growing."""

    def __init__(self, *, max_concurrency: int, max_queue: int) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.in_flight = 0
        self.queued = 0
        self._cond = asyncio.Condition()

    @property
    def state(self) -> str:
        if self.in_flight < self.max_concurrency:
            return "ACCEPTING"
        return "QUEUEING" if self.queued < self.max_queue else "REJECTING"

    @asynccontextmanager
    async def slot(self, wait_s: float) -> AsyncIterator[None]:
        async with self._cond:
            if self.in_flight >= self.max_concurrency:
                if self.queued >= self.max_queue:
                    raise AdmissionFull(
                        f"{self.in_flight} in flight and {self.queued} queued: at capacity"
                    )
                self.queued += 1
                try:
                    async with asyncio.timeout(wait_s):
                        await self._cond.wait_for(lambda: self.in_flight < self.max_concurrency)
                except TimeoutError:
                    raise DeadlineExceeded("deadline reached while queued for a slot") from None
                finally:
                    self.queued -= 1
            self.in_flight += 1
        try:
            yield
        finally:
            async with self._cond:
                self.in_flight -= 1
                self._cond.notify(1)


class TokenBucket:
    """Rate limit before the rail (STD01-08): `rate` per second, bursts up to `burst`."""

    def __init__(self, *, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def take(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens < 1:
            raise RateLimited("rate limit reached for this rail connection")
        self.tokens -= 1

    @property
    def throttling(self) -> bool:
        elapsed = time.monotonic() - self.updated
        return self.tokens + elapsed * self.rate < 1


@dataclass(frozen=True)
class Sample:
    at: float
    latency_s: float
    ok: bool
    timeout: bool


class Evidence:
    """Recent bounded telemetry of forwards for /health (latency, errors, timeouts)."""

    def __init__(self, size: int) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)
        self.last_success_at: datetime | None = None

    def add(self, latency_s: float, *, ok: bool, timeout: bool) -> None:
        self.samples.append(Sample(time.monotonic(), latency_s, ok, timeout))
        if ok:
            self.last_success_at = datetime.now(UTC)

    def summary(self) -> dict[str, float | int | None]:
        n = len(self.samples)
        latencies = sorted(s.latency_s for s in self.samples)
        return {
            "samples": n,
            "error_ratio": sum(not s.ok for s in self.samples) / n if n else None,
            "timeout_ratio": sum(s.timeout for s in self.samples) / n if n else None,
            "latency_p50_s": latencies[n // 2] if n else None,
            "latency_p99_s": latencies[min(n - 1, int(n * 0.99))] if n else None,
        }
