"""UNIT tests of the SDK's pending releases (lockservice.sdk.releases, issue 24 item 6): a release
that did not get its answer is retried until it succeeds or the session ends, never forgotten,
and never ends another grant. A controllable clock and the real server app over the in-memory
FakeBackend (httpx.ASGITransport); the lock-server crash on the real backends is
test_lock_server_crash.py."""

from __future__ import annotations

import asyncio
import random
from collections.abc import MutableMapping
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from lockservice import api
from lockservice.sdk import Lease, LockClient, retry_budget_s
from lockservice.sdk.releases import PENDING_OUTCOMES, RELEASES_PENDING
from lockservice.server import create_app
from tests.lockservice import server_fixtures as _fx
from tests.lockservice.fake_backend import FakeBackend
from tests.lockservice.server_fixtures import FakeClock, eventually

fake_backend = _fx.fake_backend  # fixture

TTL, HB = 15.0, 5.0


class _LoseReleaseAnswers(httpx.AsyncBaseTransport):
    """Release requests reach the server (it acts on them) but their answers are lost, while
    `lose` is true: the client cannot tell this from a release that never arrived."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.lose = inner, True

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if self.lose and request.url.path == "/v1/locks/release":
            raise httpx.ReadTimeout("answer lost", request=request)
        return response


def _client(
    backend: FakeBackend, clock: FakeClock, transport: httpx.AsyncBaseTransport | None = None
) -> LockClient:
    backend.clock = clock
    return LockClient(
        "http://lock",
        ttl_s=TTL,
        heartbeat_s=HB,
        clock=clock,
        sleep=clock.sleep,
        transport=transport or httpx.ASGITransport(app=create_app(backend)),
        rng=random.Random(3),
    )


async def _release_fails(c: LockClient, lease: Lease, clock: FakeClock) -> None:
    """`c.release(lease)` while every try fails: its bounded retries sleep on the fake clock,
    so the clock moves past their budget while it runs; it must raise BackendUnavailable."""
    task = asyncio.create_task(c.release(lease))
    await clock.advance(c.retry_budget_s + 0.01)
    with pytest.raises(api.BackendUnavailable):
        await task


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def _outcomes(outcome: str) -> float:
    return PENDING_OUTCOMES.labels(outcome=outcome)._value.get()  # type: ignore[no-any-return]


async def test_unit_a_release_during_an_outage_is_retried_until_the_server_is_back(
    fake_backend: FakeBackend,
) -> None:
    """The server is away far longer than the bounded retries (and than the old reaper's delay
    plus its retries): the release stays pending, the grant stays held, and once the server
    answers again the retry releases it, with one event per step and the gauge back to zero."""
    clock = FakeClock(start=0.0)
    released_before = _outcomes("released")
    with capture_logs() as logs:
        async with _client(fake_backend, clock) as c:
            lease = await c.acquire("payout:outage")
            fake_backend.unavailable = True  # every call answers 503, keepalives included
            await _release_fails(c, lease, clock)
            assert c.releases_pending == 1 and RELEASES_PENDING._value.get() >= 1
            await clock.advance(12.0)  # > request_timeout_s + 2 x retry budget, < TTL
            assert c.releases_pending == 1, "a release was given up while its session lives"
            assert "payout:outage" in fake_backend.held  # nobody else could get the account
            fake_backend.unavailable = False
            await clock.advance(c.backoff_max_s)  # the next retry comes within one backoff cap
            await eventually(lambda: c.releases_pending == 0)
            assert "payout:outage" not in fake_backend.held
            assert c.session_state()["releases_pending"] == 0
    [pending] = _events(logs, "lock.release_pending")
    [recovered] = _events(logs, "lock.release_recovered")
    assert pending["key"] == recovered["key"] == "payout:outage"
    assert recovered["token"] == lease.token and int(str(recovered["retries"])) > 1
    assert _outcomes("released") == released_before + 1


async def test_unit_a_release_whose_answer_was_lost_after_the_server_released_is_harmless(
    fake_backend: FakeBackend,
) -> None:
    """The server released, the answer was lost: the retry is refused as not_held (the
    compare-and-delete found nothing) and ends, leaving the key free for the next holder."""
    clock = FakeClock()
    transport = _LoseReleaseAnswers(httpx.ASGITransport(app=create_app(fake_backend)))
    with capture_logs() as logs:
        async with _client(fake_backend, clock, transport) as c, _client(fake_backend, clock) as d:
            lease = await c.acquire("payout:lost-answer")
            await _release_fails(c, lease, clock)
            assert "payout:lost-answer" not in fake_backend.held  # it did happen
            transport.lose = False
            await clock.advance(c.backoff_max_s)  # the next retry comes within one backoff cap
            await eventually(lambda: c.releases_pending == 0)
            nxt = await d.acquire("payout:lost-answer", wait_s=0)
            assert nxt.token > lease.token
    assert [e["token"] for e in _events(logs, "lock.release_already_ended")] == [lease.token]
    assert not _events(logs, "lock.release_recovered")


async def test_unit_a_pending_release_never_ends_a_newer_grant_of_the_same_session(
    fake_backend: FakeBackend,
) -> None:
    """While a release of token T1 is pending, T1 ends at the server (an operator's revoke) and
    the same session is granted the key again as T2: the retry of T1 is refused, T2 stays."""
    clock = FakeClock()
    async with _client(fake_backend, clock) as c:
        old = await c.acquire("payout:same-session")
        fake_backend.unavailable = True
        await _release_fails(c, old, clock)
        fake_backend.unavailable = False
        await fake_backend.force_revoke("payout:same-session", "ana", "drill")
        # Win the race by construction: the newer grant is made before any retry runs.
        new = await c.acquire("payout:same-session", wait_s=0)
        assert new.grant.session_id == old.grant.session_id and new.token > old.token
        await clock.advance(c.backoff_max_s * 3)
        await eventually(lambda: c.releases_pending == 0)
        assert fake_backend.held["payout:same-session"].token == new.token
        assert new.still_held()


async def test_unit_a_pending_release_ends_when_its_session_ends(
    fake_backend: FakeBackend,
) -> None:
    """The session expired at the server during the outage (its grants with it): once the
    heartbeat learns it, the pending release stops, as `session_ended`, without a request."""
    clock = FakeClock()
    with capture_logs() as logs:
        async with _client(fake_backend, clock) as c:
            lease = await c.acquire("payout:expired")
            fake_backend.unavailable = True
            await _release_fails(c, lease, clock)
            fake_backend.sessions.clear()  # expired server-side
            fake_backend.held.clear()
            fake_backend.unavailable = False
            await clock.advance(HB)  # the heartbeat is answered session_not_found
            await eventually(lambda: c.releases_pending == 0)
    [ended] = _events(logs, "lock.release_session_ended") or _events(
        logs, "lock.release_already_ended"
    )
    assert ended["token"] == lease.token


async def test_unit_close_reports_the_releases_it_leaves_and_ends_them_with_the_session(
    fake_backend: FakeBackend,
) -> None:
    """A process that shuts down with a release still pending closes its session (which ends
    the grant) and says so in one event; nothing keeps retrying after close."""
    clock = FakeClock()
    with capture_logs() as logs:
        c = _client(fake_backend, clock)
        await c.open()
        lease = await c.acquire("payout:shutdown")
        fake_backend.unavailable = True
        await _release_fails(c, lease, clock)
        fake_backend.unavailable = False
        await c.close()  # before any retry ran
    assert c.releases_pending == 0
    assert "payout:shutdown" not in fake_backend.held  # ended with the session
    [left] = _events(logs, "lock.releases_left_at_close")
    assert left["count"] == 1 and left["session_closed"] is True


async def test_unit_an_orphan_reaper_keeps_asking_while_the_server_is_away(
    fake_backend: FakeBackend,
) -> None:
    """An acquire whose answer may hide a grant is reaped however long the server is away
    (the reaper used to give up after `attempts` tries)."""
    clock = FakeClock()
    async with _client(fake_backend, clock) as c:
        assert c.session_id is not None
        orphan = await fake_backend.acquire(c.session_id, "payout:orphan", 0)  # granted, unseen
        assert isinstance(orphan, api.Grant)
        fake_backend.unavailable = True
        c._reap_later("payout:orphan", 0.0)
        await clock.advance(12.0)
        assert c.reaping == 1 and "payout:orphan" in fake_backend.held
        fake_backend.unavailable = False
        await clock.advance(c.backoff_max_s)
        await eventually(lambda: c.reaping == 0)
        assert "payout:orphan" not in fake_backend.held and c.orphans_released == 1


def test_unit_retry_budget_is_the_sum_of_the_backoff_caps() -> None:
    """The bounded call's budget against a server that refuses at once: 0.1 + 0.2 + 0.4 s with
    the defaults, each backoff capped at backoff_max_s."""
    assert retry_budget_s() == pytest.approx(0.7)
    assert retry_budget_s(6, 0.5, 2.0) == pytest.approx(1.0 + 2.0 + 2.0 + 2.0 + 2.0)
    assert retry_budget_s(1) == 0.0
    assert LockClient("http://x", attempts=3).retry_budget_s == pytest.approx(0.3)
