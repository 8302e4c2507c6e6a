"""PostgreSQL backend only: the hand-off between consecutive holders of a key (issue 29). A
release's NOTIFY wakes one of the key's waiters, the longest-waiting one, and a woken waiter that
cannot take the key for a reason other than 'held' hands the wake-up on (the rule itself:
tests/lockservice/test_wakeups_unit.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from lockservice.api import Grant, SessionNotFound
from lockservice.server.backends.postgres import PostgresBackend
from lockservice.server.backends.postgres_common import CHANNEL
from lockservice.server.backends.wakeups import Wakeups

#: Longer than anything here takes, shorter than the backend's wait cap (5 s): a waiter that is
#: never woken comes back only at its deadline (and attempts once more then).
_WAIT_S = 4.0


class _NoHandOn(Wakeups):
    """The negative control: a waiter that leaves hands nothing on (before the rule)."""

    def leave(self, key: str, event: asyncio.Event, *, hand_on: bool) -> None:
        super().leave(key, event, hand_on=False)


async def _started(lock_database_url: str, key_prefix: str, wakeups: Wakeups) -> PostgresBackend:
    return await PostgresBackend.start(lock_database_url, prefix=key_prefix, wakeups=wakeups)


class _SleepCounted(asyncio.Event):
    """A waiter's event that counts the naps it starts: the second nap begins only after the
    attempt its first wake-up caused has returned."""

    def __init__(self) -> None:
        super().__init__()
        self.naps = 0

    async def wait(self) -> bool:  # type: ignore[override]
        self.naps += 1
        return await super().wait()


class _Counted(Wakeups):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[_SleepCounted] = []

    def join(self, key: str) -> asyncio.Event:
        event = _SleepCounted()
        self.events.append(event)
        self._waiting.setdefault(key, {})[event] = None
        return event


@pytest.fixture
async def pg(lock_database_url: str, key_prefix: str) -> AsyncIterator[PostgresBackend]:
    backend = await _started(lock_database_url, key_prefix, Wakeups())
    yield backend
    await backend.close()


async def _until_waiters(pg: PostgresBackend, key: str, n: int) -> None:
    """Until the key counts n waiters (each registers after its first attempt found it held)."""
    for _ in range(1000):
        if (await pg.inspect(key)).waiters == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{key} never had {n} waiters")


async def test_releases_hand_the_key_to_the_waiters_in_arrival_order(pg: PostgresBackend) -> None:
    """Each release wakes the longest-waiting acquirer only, which takes the key; the others
    sleep on until their turn."""
    holder = await pg.open_session(60)
    grant = await pg.acquire(holder.session_id, "k", 0)
    assert isinstance(grant, Grant)
    arrival = {}
    for i in range(3):
        s = await pg.open_session(60)
        arrival[asyncio.create_task(pg.acquire(s.session_id, "k", 30))] = i
        await _until_waiters(pg, "k", i + 1)
    order = []
    pending = set(arrival)
    while pending:
        await pg.release(grant)
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        [task] = done
        got = task.result()
        assert isinstance(got, Grant)
        grant = got
        order.append(arrival[task])
    assert order == [0, 1, 2]
    await pg.release(grant)


@pytest.mark.parametrize("rule", ["hand-on", "control-no-hand-on"])
async def test_a_woken_waiter_that_cannot_take_the_key_wakes_the_next(
    lock_database_url: str, key_prefix: str, rule: str
) -> None:
    """The longest-waiting acquirer's session expired silently while it slept; the release wakes
    it, its attempt fails (no session), and it hands the wake-up on: the next waiter gets the key
    at once. Control: without the hand-on that waiter sleeps until its deadline (its last attempt
    then takes the key), although the key lay free all along."""
    wakeups = Wakeups() if rule == "hand-on" else _NoHandOn()
    pg = await _started(lock_database_url, key_prefix, wakeups)
    try:
        holder = await pg.open_session(60)
        grant = await pg.acquire(holder.session_id, "k", 0)
        assert isinstance(grant, Grant)
        doomed = await pg.open_session(1.0)  # never kept alive
        first = asyncio.create_task(pg.acquire(doomed.session_id, "k", 30))
        await _until_waiters(pg, "k", 1)
        # Past its 1 s TTL on the database's clock: expired, silently (no NOTIFY), while the
        # waiter sleeps towards the holder's expiry or the 5 s cap; inspect stops counting it.
        await asyncio.sleep(1.5)
        await _until_waiters(pg, "k", 0)
        assert not first.done()
        patient = await pg.open_session(60)
        second = asyncio.create_task(pg.acquire(patient.session_id, "k", _WAIT_S))
        await _until_waiters(pg, "k", 1)
        loop = asyncio.get_running_loop()
        await pg.release(grant)
        released = loop.time()
        got = await second
        waited = loop.time() - released
        with pytest.raises(SessionNotFound):
            await first
        assert isinstance(got, Grant)  # the attempt at its deadline finds the key free anyway
        await pg.release(got)
        if rule == "hand-on":
            assert waited < _WAIT_S / 2  # milliseconds; the margin is for a loaded machine
        else:
            assert waited >= _WAIT_S / 2  # only its deadline woke it: the key lay free meanwhile
    finally:
        await pg.close()


async def test_a_woken_waiter_keeps_its_row_until_the_attempt_that_grants_it(
    lock_database_url: str, key_prefix: str
) -> None:
    """A waiter's attempt removes its waiter row in the statement that grants it the key, and
    only then: woken while the key is still held (a NOTIFY sent by hand), it is still counted
    once that attempt returned; the release's wake-up grants it and it is counted no more."""
    wakeups = _Counted()
    pg = await _started(lock_database_url, key_prefix, wakeups)
    try:
        holder = await pg.open_session(60)
        grant = await pg.acquire(holder.session_id, "k", 0)
        assert isinstance(grant, Grant)
        waiter = await pg.open_session(60)
        blocked = asyncio.create_task(pg.acquire(waiter.session_id, "k", 30))
        await _until_waiters(pg, "k", 1)
        [event] = wakeups.events
        conn = await asyncpg.connect(lock_database_url)
        try:
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, key_prefix + "k")
        finally:
            await conn.close()
        for _ in range(1000):  # its woken attempt found the key held and it sleeps again
            if event.naps >= 2:
                break
            await asyncio.sleep(0.01)
        assert event.naps >= 2 and not blocked.done()
        assert (await pg.inspect("k")).waiters == 1
        await pg.release(grant)
        got = await blocked
        assert isinstance(got, Grant)
        assert (await pg.inspect("k")).waiters == 0
        await pg.release(got)
    finally:
        await pg.close()
