"""The publisher's linger (`OutboxSettings.linger_s`, `outbox.publisher.next_cycle`): after a
NOTIFY wakes it, the next delivery cycle waits `linger_s` so that the commits of those
milliseconds join one batch; a poll's cycle and a stop do not wait.

Unit tests on real asyncio events and the loop's clock; the two that record the waits replace
`_wait_any` with a recorder (a mock, named so)."""

from __future__ import annotations

import asyncio

import pytest

from outbox import publisher
from outbox.delivery import OutboxSettings
from outbox.publisher import next_cycle

#: asyncio may run a timer up to the loop's clock resolution early.
_EARLY = 0.001


async def test_a_wake_up_is_followed_by_the_linger() -> None:
    wake, stop = asyncio.Event(), asyncio.Event()
    wake.set()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await next_cycle(wake, stop, poll_s=60.0, linger_s=0.2)
    assert loop.time() - started >= 0.2 - _EARLY


async def test_a_stop_ends_the_linger() -> None:
    """A stop ends a linger far longer than the test (the guard only catches a hang)."""
    wake, stop = asyncio.Event(), asyncio.Event()
    wake.set()
    waiting = asyncio.create_task(next_cycle(wake, stop, poll_s=60.0, linger_s=3600.0))
    await asyncio.sleep(0)
    stop.set()  # in the wake-up's wait or in the linger: either way the cycle is due
    await asyncio.wait_for(waiting, timeout=60)


Waits = list[tuple[bool, float | None]]


@pytest.fixture
def recorded_waits(monkeypatch: pytest.MonkeyPatch) -> Waits:
    """Mock: `_wait_any` returns at once, recording (is it the linger's wait, its timeout)."""
    waits: Waits = []

    async def record(a: asyncio.Event, b: asyncio.Event, *, within_s: float | None) -> None:
        waits.append((a is b, within_s))

    monkeypatch.setattr(publisher, "_wait_any", record)
    return waits


async def test_mock_only_a_wake_up_lingers(recorded_waits: Waits) -> None:
    wake, stop = asyncio.Event(), asyncio.Event()
    await next_cycle(wake, stop, poll_s=2.0, linger_s=0.05)  # the poll's timeout: no linger
    assert recorded_waits == [(False, 2.0)]
    recorded_waits.clear()
    wake.set()
    await next_cycle(wake, stop, poll_s=2.0, linger_s=0.05)
    assert recorded_waits == [(False, 2.0), (True, 0.05)]


async def test_mock_a_linger_of_zero_is_a_cycle_per_wake_up(recorded_waits: Waits) -> None:
    wake, stop = asyncio.Event(), asyncio.Event()
    wake.set()
    await next_cycle(wake, stop, poll_s=2.0, linger_s=0.0)
    assert recorded_waits == [(False, 2.0)]


def test_the_linger_is_bounded() -> None:
    assert OutboxSettings().linger_s == 0.05
    assert OutboxSettings(linger_s=0).linger_s == 0
    for bad in (-0.01, 5.01):
        with pytest.raises(ValueError, match="linger_s"):
            OutboxSettings(linger_s=bad)
