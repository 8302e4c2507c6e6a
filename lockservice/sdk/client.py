"""Async client SDK of the lock server: one session per process, a background heartbeat, a
conservative local lease deadline and a lock-lost signal (FR-11, FR-12, FR-13, FR-27, FR-28).

Owns: the process's session, its local deadline and the leases it hands out. Beside it: the
calls with bounded jittered retries (`lockservice.sdk.calls`), the `Lease` (`lease`), the
heartbeat and watchdog loops (`heartbeat`), one acquire per key at a time (`turns`), and the
releases it still owes the server and its orphan reapers (`releases`).
Must never: hand out a `Lease` without a grant from the server, offer any option to proceed
without a grant (failing open is not configurable, FR-27), treat `still_held()` as the safety
mechanism, or forget a release that did not succeed while its session lives. Safety comes
from the resources checking the fencing token (T >= stored fence).

One object read whole (about 415 lines, over the ~400 of a module on purpose): what is left here
is `LockClient`'s own methods, and they share one session, one local deadline and one set of
leases, whose rules (no lease without a grant, a deadline that always falls before the server's
expiry, a lease marked lost once, a release never forgotten) hold only when read together; the
work that does not touch that state is already in the modules named above.

Errors (all subclasses of `lockservice.api.LockError`)::

    LockError
     +-- InvalidRequest       bad key / TTL / wait budget (or a 422 from the server)
     +-- SessionNotFound      the session expired or was closed server-side
     +-- NotHeld              renew/release of a grant that is no longer valid
     +-- BackendUnavailable   server or backend unreachable after the bounded retries
     +-- NotAcquiredError     no grant within the wait budget (never a lease)

Local deadline: `sent + ttl_s * (1 - safety_margin)`, where `sent` is the monotonic time at which
the last SUCCESSFUL keepalive (or the session open) was SENT. The server counts the TTL from when
it processed the request, which is later, so the local deadline always falls before the
server-side expiry, by at least `ttl_s * safety_margin` (plus the request's own latency).

Usage::

    async with LockClient("http://127.0.0.1:8701") as locks:
        lease = await locks.acquire("payout:acct-1", wait_s=2.0)
        try:
            if lease.still_held():          # liveness aid only
                await do_fenced_write(token=lease.token)   # the resource checks the token
        finally:
            await locks.release(lease)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from types import TracebackType
from typing import Any

import httpx

from common.logs import get_logger
from lockservice import api
from lockservice.api import LockError
from lockservice.sdk.calls import (
    DEFAULT_ATTEMPTS,
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_MAX_S,
    BoundedCalls,
    Clock,
    Sleep,
    choose_transport,
    retry_budget_s,
    signed_of,
)
from lockservice.sdk.heartbeat import heartbeat_loop, watchdog_loop
from lockservice.sdk.lease import Lease, LostCallback, NotAcquiredError
from lockservice.sdk.releases import BackgroundReleases, grant_body, grant_of
from lockservice.sdk.turns import KeyTurns

_log = get_logger("lockservice.client")


class LockClient:
    """One lock session for this process; use as `async with LockClient(url) as locks:`.

    There is deliberately NO option to proceed without a grant (FR-27): `acquire` either returns a
    `Lease` backed by a server grant or raises. `attempts` bounds every retried call (FR-28).
    """

    def __init__(
        self,
        base_url: str,
        *,
        ttl_s: float = 15.0,
        heartbeat_s: float = 5.0,
        safety_margin: float = 0.3,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        request_timeout_s: float = 5.0,
        on_lost: LostCallback | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        token: str | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        api.validate_ttl(ttl_s)
        if not 0 < heartbeat_s < ttl_s * (1 - safety_margin):
            raise api.InvalidRequest("heartbeat_s must be positive and below the local deadline")
        if not 0 < safety_margin < 1:
            raise api.InvalidRequest("safety_margin must be between 0 and 1")
        if attempts < 1:
            raise api.InvalidRequest("attempts must be at least 1")
        self.ttl_s, self.heartbeat_s, self.safety_margin = ttl_s, heartbeat_s, safety_margin
        self.attempts, self.backoff_base_s, self.backoff_max_s = (
            attempts,
            backoff_base_s,
            backoff_max_s,
        )
        self.request_timeout_s = request_timeout_s
        self.on_lost = on_lost
        self.clock, self.sleep = clock, sleep
        self.calls = BoundedCalls(
            base_url,
            transport=choose_transport(base_url, verify, transport),
            token=token,
            request_timeout_s=request_timeout_s,
            attempts=attempts,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
            clock=clock,
            sleep=sleep,
            rng=rng or random.Random(),
        )
        self.session_id: str | None = None
        self.deadline = float("-inf")  # no session: nothing is held
        self._leases: set[Lease] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # Orphan reaping (see `_reap`): one turn per key (an acquire in flight or a reaper), the
        # token last handed to a caller per key (until the caller releases it), the reapers.
        self.turns = KeyTurns()
        self.issued: dict[str, int] = {}
        self._background = BackgroundReleases(self)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LockClient:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def open(self) -> None:
        await self._open_session()
        self._tasks = [
            asyncio.create_task(heartbeat_loop(self), name="lock-heartbeat"),
            asyncio.create_task(watchdog_loop(self), name="lock-watchdog"),
        ]

    async def close(self) -> None:
        """Stop the heartbeat and close the session, which releases every lock it holds.

        Releases still pending are not retried any more: closing the session ends their grants
        too; if the server cannot be reached to close it, they end when the session expires,
        within its TTL, now that nothing heartbeats it. `lock.releases_left_at_close` says which.
        """
        owed = self._background.pending
        # Cancel until they are done: on Python 3.11 `asyncio.wait_for` can swallow a
        # cancellation that races with its inner call completing, so one cancel() may not stop
        # a loop; re-cancel whatever is still running instead of waiting on it forever.
        pending = set(self._tasks) | self._background.tasks()
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        self._tasks = []
        sid, self.session_id = self.session_id, None
        self.session_lost("closed")
        closed = False
        if sid is not None:
            with contextlib.suppress(LockError, httpx.HTTPError):
                r = await self.calls.http.delete(f"/v1/sessions/{sid}", timeout=2.0)
                closed = r.status_code == 204
        if owed:
            _log.warning(
                "lock.releases_left_at_close",
                count=owed,
                session_id=sid,
                session_closed=closed,
                grants_end="now, with the session" if closed else f"within {self.ttl_s}s (TTL)",
            )
        await self.calls.http.aclose()

    @property
    def leases_held(self) -> int:
        """Leases handed out and not yet released or lost."""
        return len(self._leases)

    @property
    def http_attempts(self) -> int:
        """Requests sent, for tests and diagnostics."""
        return self.calls.http_attempts

    @property
    def local_ttl_s(self) -> float:
        return self.ttl_s * (1 - self.safety_margin)

    # ------------------------------------------------------------------ locks

    async def acquire(self, key: str, wait_s: float = 0.0, *, attempts: int | None = None) -> Lease:
        """A `Lease` backed by a server grant, or an exception; never anything else.

        Raises NotAcquiredError (held / timeout), BackendUnavailable after `attempts` tries with
        jittered exponential backoff, InvalidRequest for a bad key or wait budget.
        """
        api.validate_key(key)
        api.validate_wait(wait_s)
        give_up_at = self.clock() + wait_s
        requested = False
        lease: Lease | None = None
        try:
            # One acquire of a key at a time in this process: the others wait here, not on the
            # server. That keeps the lock server's waiters few, and it lets a reaper know that
            # no acquire of the key is in flight while it holds the key's turn.
            async with self.turns.turn(key, wait_s):
                requested = True
                lease = await self._acquire(key, give_up_at, attempts)
                self.issued[key] = lease.token
                return lease
        finally:
            if requested and lease is None:
                # A timeout, a lost connection or a cancellation may hide a grant the server
                # made to this session, possibly later still, when the server-side wait of a
                # request we gave up on ends: reap after that (see `_reap`).
                late = max(0.0, give_up_at - self.clock()) + self.request_timeout_s
                self._reap_later(key, late)

    async def _acquire(self, key: str, give_up_at: float, attempts: int | None) -> Lease:
        for retry in (False, True):
            await self._ensure_session()
            sid = self.session_id
            assert sid is not None

            def body(sid: str = sid) -> dict[str, Any]:
                # Recomputed for every transport retry: a retry after a reset connection must
                # not start the whole wait over (four full waits outlived the caller's own
                # timeout, and the grant that came at the end went to nobody).
                return {
                    "session_id": sid,
                    "key": key,
                    "wait_s": max(0.0, give_up_at - self.clock()),
                }

            try:
                data = await self.calls.request(
                    "POST",
                    "/v1/locks/acquire",
                    json=body,
                    attempts=attempts,
                    timeout_s=self.request_timeout_s,
                    wait_in_body=True,
                    deadline=give_up_at + self.request_timeout_s,
                )
            except NotAcquiredError as exc:
                raise NotAcquiredError(key, exc.reason) from None
            except api.SessionNotFound:
                # The session died under us (pause, partition): its grants are lost. Only the
                # first acquire to notice says so; others waiting concurrently under the same
                # session must not mark the NEXT session's leases lost.
                if self.session_id == sid:
                    self.session_lost("session_expired")
                if retry:
                    raise
                # This acquire held nothing yet, so one more try under a fresh session is safe
                # and spares the caller a backoff (a paused worker's waiters all fail at once).
                continue
            lease = Lease(grant_of(data), self, signed_of(data))
            self._leases.add(lease)
            return lease
        raise AssertionError("unreachable")  # the loop returns or raises

    async def renew(self, lease: Lease) -> Lease:
        """Extend a still-valid grant; NotHeld (and the lost signal) otherwise (FR-06)."""
        try:
            data = await self.calls.request("POST", "/v1/locks/renew", json=grant_body(lease.grant))
        except api.NotHeld:
            self._mark_lost(lease, "renew_refused")
            raise
        lease.grant = grant_of(data)
        lease.signed = signed_of(data)
        return lease

    async def release(self, lease: Lease) -> None:
        """Compare-and-delete of this lease's own grant. NotHeld if it was no longer valid.

        A release that gets no answer (the server unreachable past the bounded retries, an
        answer lost, the caller cancelled) still raises, and is NOT forgotten: it stays pending
        and is retried in the background until it succeeds or this session ends
        (`releases_pending`, lockservice.sdk.releases). Why: the session lives on by its heartbeat,
        so a grant nobody releases would hold its account for ever (issue 24 item 6).
        """
        self._leases.discard(lease)
        lease.released = True
        if self.issued.get(lease.key) == lease.token:
            del self.issued[lease.key]  # the caller gave it up: a reaper may release it now
        try:
            await self.calls.request("POST", "/v1/locks/release", json=grant_body(lease.grant))
        except api.NotHeld:
            self._mark_lost(lease, "release_refused")
            raise
        except BaseException as exc:
            # It may not have happened, and this session stays alive: owe it to the server.
            self._background.keep(lease.grant, why=str(exc) or type(exc).__name__)
            raise

    @property
    def releases_pending(self) -> int:
        """Releases that did not get their answer yet and are being retried."""
        return self._background.pending

    @property
    def retry_budget_s(self) -> float:
        """How long one bounded call (acquire, release, ...) retries against a server that
        refuses connections at once (a SIGKILLed lock server) before it raises: `retry_budget_s`
        of this client's attempts and backoffs."""
        return retry_budget_s(self.attempts, self.backoff_base_s, self.backoff_max_s)

    # ------------------------------------------------------------------ orphaned grants

    @property
    def reaping(self) -> int:
        """Reapers still running (for tests and diagnostics)."""
        return self._background.reaping

    @property
    def orphans_released(self) -> int:
        """Orphaned grants the reapers released (for tests and diagnostics)."""
        return self._background.orphans_released

    def _reap_later(self, key: str, delay_s: float) -> None:
        self._background.reap_later(key, delay_s)

    # ------------------------------------------------------------------ session and deadline

    def session_state(self) -> dict[str, Any]:
        """What a health endpoint may say of this client's lock session (never a correctness
        decision): `none` (no session yet, or it was lost and not reopened), `live` (within its
        local deadline) or `past_deadline` (heartbeats are failing: leases are lost)."""
        if self.session_id is None:
            state = "none"
        elif self.clock() < self.deadline:
            state = "live"
        else:
            state = "past_deadline"
        return {
            "session": state,
            "leases_held": self.leases_held,
            "releases_pending": self._background.pending,
            "seconds_to_deadline": round(max(0.0, self.deadline - self.clock()), 3)
            if self.session_id is not None
            else None,
        }

    async def _open_session(self) -> None:
        sent = self.clock()
        data = await self.calls.request("POST", "/v1/sessions", json={"ttl_s": self.ttl_s})
        self.session_id = str(data["session_id"])
        self.deadline = sent + self.local_ttl_s

    async def _ensure_session(self) -> None:
        if self.session_id is None:
            await self._open_session()
        elif self.clock() >= self.deadline and not await self.keepalive_once():
            # Our view of the session was stale and it is gone: a new one before a new lease.
            await self._open_session()

    async def keepalive_once(self) -> bool:
        """One keepalive; True if it succeeded (and moved the deadline), False if the session is
        gone. Transport failures propagate as BackendUnavailable."""
        sid = self.session_id
        if sid is None:
            return False
        sent = self.clock()
        try:
            await self.calls.request("POST", f"/v1/sessions/{sid}/keepalive", attempts=1)
        except api.SessionNotFound:
            self.session_lost("session_expired")
            return False
        if self.session_id == sid:
            self.deadline = max(self.deadline, sent + self.local_ttl_s)
        return True

    def session_lost(self, reason: str) -> None:
        """Every lease of this session is lost (deadline passed, session expired or closed)."""
        if reason != "deadline":
            self.session_id = None
            self.deadline = float("-inf")
        for lease in list(self._leases):
            self._mark_lost(lease, reason)

    def _mark_lost(self, lease: Lease, reason: str) -> None:
        self._leases.discard(lease)
        if lease.lost.is_set():
            return
        lease.lost_reason = reason
        lease.lost.set()
        _log.warning("lock.lost", key=lease.key, token=lease.token, reason=reason)
        if self.on_lost is not None:
            try:
                self.on_lost(lease, reason)
            except Exception:  # a buggy callback must not stop the other leases' signals
                _log.exception("lock.lost_callback_failed", key=lease.key)


__all__ = ["LockClient"]
