"""SDK tests. The timing tests are UNIT tests: a controllable clock, and the real server app over
the in-memory FakeBackend through httpx.ASGITransport (or httpx.MockTransport for canned
failures). The last test runs the SDK against a real lock server over both real backends."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from lockservice import api
from lockservice.sdk import Lease, LockClient, NotAcquiredError
from lockservice.server import create_app
from tests.lockservice import server_fixtures as _fx
from tests.lockservice.fake_backend import FakeBackend
from tests.lockservice.server_fixtures import (
    FakeClock,
    eventually,
    settle,
)

fake_backend = _fx.fake_backend  # fixture
live_server = _fx.live_server  # fixture
real_backend = _fx.real_backend  # fixture

TTL, HB, MARGIN = 15.0, 5.0, 0.3


def _client(backend: FakeBackend, clock: FakeClock, **kw: object) -> LockClient:
    backend.clock = clock
    transport = httpx.ASGITransport(app=create_app(backend))
    return LockClient(
        "http://lock",
        ttl_s=TTL,
        heartbeat_s=HB,
        safety_margin=MARGIN,
        clock=clock,
        sleep=clock.sleep,
        transport=transport,
        rng=random.Random(7),
        **kw,  # type: ignore[arg-type]
    )


async def test_unit_deadline_is_send_time_plus_discounted_ttl(fake_backend: FakeBackend) -> None:
    """The local deadline is open/keepalive SEND time + TTL x (1 - margin), moved by heartbeats."""
    clock = FakeClock(start=100.0)
    async with _client(fake_backend, clock) as locks:
        assert locks.deadline == pytest.approx(100.0 + TTL * (1 - MARGIN))
        await clock.advance(HB)  # the heartbeat fires at 105
        await eventually(lambda: fake_backend.calls.count("keepalive") == 1)
        assert locks.deadline == pytest.approx(105.0 + TTL * (1 - MARGIN))


async def test_unit_lost_fires_when_deadline_passes_without_heartbeat(
    fake_backend: FakeBackend,
) -> None:
    """With every keepalive failing, the lost signal fires at the deadline and not before."""
    clock = FakeClock(start=0.0)
    lost: list[tuple[int, str]] = []
    async with _client(fake_backend, clock, on_lost=lambda le, r: lost.append((le.token, r))) as c:
        lease = await c.acquire("payout:a")
        fake_backend.unavailable = True  # heartbeats now get 503
        await clock.advance(10.4)
        assert lease.still_held() and not lease.lost.is_set()
        await clock.advance(0.2)  # past 10.5 = 15 x 0.7
        await eventually(lease.lost.is_set)
        assert not lease.still_held()
        assert lease.lost_reason == "deadline"
        assert lost == [(lease.token, "deadline")]


async def test_unit_successful_heartbeats_keep_the_lease(fake_backend: FakeBackend) -> None:
    """Negative control: with heartbeats succeeding, the lease survives many TTLs."""
    clock = FakeClock(start=0.0)
    async with _client(fake_backend, clock) as c:
        lease = await c.acquire("payout:a")
        for _ in range(12):  # 60 s, four TTLs
            await clock.advance(HB)
            await settle()
        assert lease.still_held()
        assert fake_backend.calls.count("keepalive") >= 10


async def test_unit_still_held_false_after_deadline_even_without_watchdog(
    fake_backend: FakeBackend,
) -> None:
    """still_held() checks the clock itself, so a holder that just woke up sees False at once."""
    clock = FakeClock(start=0.0)
    async with _client(fake_backend, clock) as c:
        lease = await c.acquire("payout:a")
        clock.now += 11.0  # time jumps (a pause) with no task having run
        assert not lease.still_held()
        assert lease.lost.is_set()


async def test_unit_session_expiry_fires_lost_and_renew_fails(fake_backend: FakeBackend) -> None:
    """A keepalive answered 'session not found' fires lost; renew then raises NotHeld."""
    clock = FakeClock(start=0.0)
    async with _client(fake_backend, clock) as c:
        lease = await c.acquire("payout:a")
        fake_backend.sessions.clear()  # the server-side session is gone
        await clock.advance(HB)
        await eventually(lease.lost.is_set)
        assert lease.lost_reason == "session_expired"
        with pytest.raises(api.NotHeld):
            await c.renew(lease)


async def test_unit_acquire_after_session_loss_retries_once_under_a_new_session(
    fake_backend: FakeBackend,
) -> None:
    """An acquire that finds its session gone marks the old leases lost and succeeds under a
    fresh session; the new lease is not caught up in the old session's loss."""
    clock = FakeClock(start=0.0)
    async with _client(fake_backend, clock) as c:
        old = await c.acquire("payout:a")
        first_session = c.session_id
        fake_backend.sessions.clear()  # the server-side session is gone (a long pause)
        new = await c.acquire("payout:b")
        assert c.session_id != first_session
        assert old.lost.is_set() and old.lost_reason == "session_expired"
        assert new.still_held() and not new.lost.is_set()
        assert fake_backend.calls.count("open_session") == 2


async def test_unit_acquire_gives_up_when_the_fresh_session_is_lost_too(
    fake_backend: FakeBackend,
) -> None:
    """Negative control: the retry happens once; a second session loss reaches the caller."""
    clock = FakeClock(start=0.0)
    async with _client(fake_backend, clock) as c:
        await c.acquire("payout:a")
        fake_backend.drop_sessions_on_acquire = True
        with pytest.raises(api.SessionNotFound):
            await c.acquire("payout:b")
        assert fake_backend.calls.count("open_session") == 2


async def test_unit_not_acquired_raises_never_a_lease(fake_backend: FakeBackend) -> None:
    """A key held by another session gives NotAcquiredError, never a Lease."""
    clock = FakeClock()
    async with _client(fake_backend, clock) as first, _client(fake_backend, clock) as second:
        held = await first.acquire("payout:b")
        assert isinstance(held, Lease)
        with pytest.raises(NotAcquiredError) as info:
            await second.acquire("payout:b", wait_s=0)
        assert info.value.reason == "held" and info.value.key == "payout:b"
        await first.release(held)
        again = await second.acquire("payout:b")
        assert again.token > held.token


async def test_unit_retries_are_bounded_and_jittered() -> None:
    """On a failing transport, acquire makes exactly `attempts` tries with jittered waits."""
    clock = FakeClock(start=0.0)
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/v1/sessions":
            return httpx.Response(200, json={"session_id": "s1", "ttl_s": TTL, "expires_at": "x"})
        if request.url.path.endswith("/keepalive"):
            return httpx.Response(200, json={})
        raise httpx.ConnectError("refused", request=request)

    waits: list[float] = []

    async def recording_sleep(seconds: float) -> None:
        waits.append(seconds)

    c = LockClient(
        "http://lock",
        attempts=5,
        backoff_base_s=0.1,
        backoff_max_s=10.0,
        clock=clock,
        sleep=clock.sleep,
        rng=random.Random(1),
        transport=httpx.MockTransport(handler),
    )
    async with c:
        c.calls.sleep = recording_sleep  # only the retry path sleeps from here on
        with pytest.raises(api.BackendUnavailable):
            await c.acquire("payout:c")
    assert sent.count("/v1/locks/acquire") == 5
    assert len(waits) == 4
    assert all(0 <= w <= 0.1 * 2**i for i, w in enumerate(waits, start=1))
    assert len(set(waits)) == 4  # jittered: not a fixed schedule


async def test_unit_a_retried_acquire_waits_only_what_is_left() -> None:
    """A retry after a reset connection asks the server for the REMAINING wait, and no attempt
    runs past wait + request timeout: four full waits outlived the caller's own timeout, and
    the grant that came at the end went to nobody."""
    clock = FakeClock(start=0.0)
    waits: list[float] = []
    timeouts: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/sessions":
            return httpx.Response(200, json={"session_id": "s1", "ttl_s": TTL, "expires_at": "x"})
        if request.url.path != "/v1/locks/acquire":
            return httpx.Response(200, json={})  # keepalive, session close
        waits.append(float(json.loads(request.content)["wait_s"]))
        timeouts.append(float(request.extensions["timeout"]["read"]))
        clock.now += 20.0  # the server waited 20 s, then the connection was reset
        raise httpx.ReadError("reset", request=request)

    async def no_wait(_: float) -> None:
        return None

    c = LockClient(
        "http://lock", clock=clock, sleep=clock.sleep, transport=httpx.MockTransport(handler)
    )
    async with c:
        c.calls.sleep = no_wait
        with pytest.raises(api.BackendUnavailable):
            await c.acquire("payout:w", wait_s=30.0)
    assert waits == [30.0, 10.0]  # then the budget (30 s + request timeout) was spent
    assert timeouts[0] == 30.0 + c.request_timeout_s
    assert timeouts[1] == pytest.approx(15.0)  # capped by what is left of the budget


async def test_unit_503_is_retried_then_fails_closed(fake_backend: FakeBackend) -> None:
    """A backend outage (503) is retried `attempts` times, then raises: no lease is handed out."""
    clock = FakeClock()
    async with _client(fake_backend, clock, attempts=3) as c:
        fake_backend.unavailable = True
        fake_backend.calls.clear()

        async def no_wait(_: float) -> None:
            return None

        c.calls.sleep = no_wait
        with pytest.raises(api.BackendUnavailable):
            await c.acquire("payout:d")
        assert fake_backend.calls.count("acquire") == 3


class _LoseAnswers(httpx.AsyncBaseTransport):
    """The first request to `path` times out on the client's side. With `forward`, the server
    received and acted on it (its answer was lost: a reset connection, a restart); without,
    it never arrived. The client cannot tell the two apart."""

    def __init__(self, inner: httpx.AsyncBaseTransport, path: str, forward: bool) -> None:
        self.inner, self.path, self.forward, self.lose = inner, path, forward, 1

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == self.path and self.lose > 0:
            self.lose -= 1
            if self.forward:
                await self.inner.handle_async_request(request)
            raise httpx.ReadTimeout("answer lost", request=request)
        return await self.inner.handle_async_request(request)


def _lossy_client(
    backend: FakeBackend, clock: FakeClock, path: str, *, forward: bool
) -> LockClient:
    backend.clock = clock
    transport = _LoseAnswers(httpx.ASGITransport(app=create_app(backend)), path, forward)
    return LockClient(
        "http://lock", clock=clock, sleep=clock.sleep, transport=transport, attempts=1
    )


async def test_unit_grant_whose_answer_was_lost_is_released(fake_backend: FakeBackend) -> None:
    """The server granted, the answer never arrived: the caller gets an error and no lease, and
    the SDK releases the orphaned grant, which its live session would otherwise keep forever."""
    clock = FakeClock()
    async with _lossy_client(fake_backend, clock, "/v1/locks/acquire", forward=True) as c:
        with pytest.raises(api.BackendUnavailable):
            await c.acquire("payout:orphan")
        assert "payout:orphan" in fake_backend.held  # the orphan: granted, known to nobody
        await clock.advance(c.request_timeout_s + 1)  # the reaper waits out the server's wait
        await eventually(lambda: c.reaping == 0)
        assert "payout:orphan" not in fake_backend.held
        assert c.orphans_released == 1
        lease = await c.acquire("payout:orphan")  # the account is not blocked
        assert lease.still_held()


async def test_unit_grant_made_after_the_client_gave_up_is_released(
    fake_backend: FakeBackend,
) -> None:
    """The server may grant after the client gave up on the request (its own wait had not
    ended): the reaper waits that out before it looks, so the late grant is released too."""
    clock = FakeClock()
    async with _lossy_client(fake_backend, clock, "/v1/locks/acquire", forward=False) as c:
        with pytest.raises(api.BackendUnavailable):
            await c.acquire("payout:late", wait_s=2.0)
        await clock.advance(1.0)
        # The server's wait ends now and grants the request nobody is waiting for any more.
        assert c.session_id is not None
        late = await fake_backend.acquire(c.session_id, "payout:late", 0)
        assert isinstance(late, api.Grant)
        await clock.advance(2.0 + c.request_timeout_s)
        await eventually(lambda: c.reaping == 0)
        assert "payout:late" not in fake_backend.held
        assert c.orphans_released == 1


async def test_unit_release_whose_answer_was_lost_is_completed(fake_backend: FakeBackend) -> None:
    """A release with an unknown outcome stays pending and is finished in the background (the
    session stays alive); more in test_pending_releases_unit.py."""
    clock = FakeClock()
    async with _lossy_client(fake_backend, clock, "/v1/locks/release", forward=False) as c:
        lease = await c.acquire("payout:r")
        with pytest.raises(api.BackendUnavailable):
            await c.release(lease)
        assert c.releases_pending == 1
        await clock.advance(1)
        await eventually(lambda: c.releases_pending == 0)
        assert "payout:r" not in fake_backend.held


async def test_unit_reaper_never_releases_a_grant_a_caller_holds(fake_backend: FakeBackend) -> None:
    """Negative control: a failed acquire of a key this process legitimately holds (own session,
    the caller's token) triggers a reaper that must leave the caller's grant alone."""
    clock = FakeClock()
    async with _client(fake_backend, clock) as c:
        lease = await c.acquire("payout:mine")
        with pytest.raises(NotAcquiredError):
            await c.acquire("payout:mine", wait_s=0)  # no re-entrancy: held, by ourselves
        assert c.reaping == 1
        await clock.advance(c.request_timeout_s + 1)
        await eventually(lambda: c.reaping == 0)
        assert fake_backend.held["payout:mine"].token == lease.token
        assert c.orphans_released == 0 and lease.still_held()


async def test_unit_no_fail_open_option() -> None:
    """The SDK exposes no parameter that would let a caller proceed without a grant (FR-27)."""
    import inspect

    names = set(inspect.signature(LockClient).parameters) | set(
        inspect.signature(LockClient.acquire).parameters
    )
    assert not {n for n in names if "open" in n or "skip" in n or "unsafe" in n or "force" in n}


async def test_sdk_against_real_server(live_server: str) -> None:
    """Against a real server and backend: acquire, renew, release; a released lease is not held."""
    async with LockClient(live_server, ttl_s=5, heartbeat_s=1) as a, LockClient(live_server) as b:
        lease = await a.acquire("payout:real", wait_s=0)
        with pytest.raises(NotAcquiredError):
            await b.acquire("payout:real", wait_s=0)
        await a.renew(lease)
        await a.release(lease)
        assert not lease.still_held()
        with pytest.raises(api.NotHeld):
            await a.release(lease)
        second = await b.acquire("payout:real", wait_s=1)
        assert second.token > lease.token
