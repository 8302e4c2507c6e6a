"""Async client SDK of the lock server: one session per process, a background heartbeat, a
conservative local lease deadline and a lock-lost signal (FR-11, FR-12, FR-13, FR-27, FR-28).

Owns: the process's session, the heartbeat, the local deadline, and bounded jittered retries;
the releases it still owes the server and its orphan reapers live in `lockservice.sdk.releases`.
Must never: hand out a `Lease` without a grant from the server, offer any option to proceed
without a grant (failing open is not configurable, FR-27), treat `still_held()` as the safety
mechanism, or forget a release that did not succeed while its session lives. Safety comes
from the resources checking the fencing token (T >= stored fence).

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
import importlib.util
import random
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import httpx

from common import tracing
from common.backoff import full_jitter
from common.correlation import httpx_hooks
from common.credentials import auth_headers
from common.logs import get_logger
from lockservice import api
from lockservice.api import Grant, LockError
from lockservice.sdk.releases import BackgroundReleases, grant_body, grant_of
from lockservice.sdk.transport import KeepAliveTransport
from lockservice.verifiers import SignedGrant

_log = get_logger("lockservice.client")

# httpcore runs `import sniffio` on every request; when sniffio is not installed (anyio >= 4.5 no
# longer needs it) each failed import searches sys.path again: ~0.3 ms, four times per request,
# which was most of the SDK's overhead in the benchmark. A None entry makes that import fail
# at once, and httpcore then assumes asyncio, which is what this SDK runs on.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]  # None = "known absent"

Clock = Callable[[], float]
#: The bounded retries of every call (FR-28): tries, and the full-jitter backoff's base and cap.
DEFAULT_ATTEMPTS = 4
DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 2.0
Sleep = Callable[[float], Awaitable[None]]
LostCallback = Callable[["Lease", str], None]


@dataclass
class _Turn:
    """One key's exclusive turn in this process, and how many are using or waiting for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class NotAcquiredError(LockError):
    """No grant within the wait budget. The caller must not perform the protected action."""

    code = "not_acquired"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key} not acquired ({reason})")
        self.key = key
        self.reason = reason


_ERROR_BY_CODE: dict[str, type[LockError]] = {
    c.code: c for c in (api.InvalidRequest, api.SessionNotFound, api.NotHeld)
}


@dataclass(eq=False)
class Lease:
    """A grant held by this process, with its lock-lost signal.

    `lost` is set (once, never cleared) when the local deadline passes, the session is found
    expired, or a renew/release is refused. `token` is what every protected write must present.
    """

    grant: Grant
    _client: LockClient = field(repr=False)
    #: The lock server's signature over `grant` (None only from a server that does not sign).
    signed: SignedGrant | None = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_reason: str | None = None
    released: bool = False

    @property
    def key(self) -> str:
        return self.grant.key

    @property
    def token(self) -> int:
        return self.grant.token

    def still_held(self) -> bool:
        """True while the conservative local deadline has not passed and nothing said otherwise.

        A LIVENESS AID, NOT THE SAFETY MECHANISM (FR-13): call it before every protected side
        effect so a paused or partitioned holder gives up early, but a True answer can be stale a
        microsecond later (the process can pause right after). What stops a second payout is the
        resource rejecting a token below its stored fence.
        """
        if self.released or self.lost.is_set():
            return False
        if self._client.clock() >= self._client.deadline:
            self._client._session_lost("deadline")
            return False
        return True

    async def signed_grant(self, *, now: datetime | None = None) -> SignedGrant | None:
        """The signed grant to present to an enforcement point, renewed first when its own
        `expires_at` is less than `ttl_s * safety_margin` away (on this host's wall clock).

        Why: a grant states the session's expiry when it was issued, and the session lives on by
        heartbeat; an enforcement point refuses a grant past its stated expiry, so a long critical
        section presents a renewed statement. NotHeld (and the lost signal) if the renew is
        refused: the grant is gone, and so is the right to write under it.
        """
        if self.signed is None:
            return None
        margin = timedelta(seconds=self._client.ttl_s * self._client.safety_margin)
        if (now or datetime.now(UTC)) >= self.signed.expires_at - margin:
            await self._client.renew(self)
        return self.signed


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
        self.clock, self._sleep = clock, sleep
        self._rng = rng or random.Random()
        if transport is None and base_url.startswith("http://"):
            # The lean keep-alive transport: same httpx API and errors, ~0.5 ms less per request;
            # traced (a client span, and `traceparent` to the server) when tracing is on.
            transport = tracing.traced_transport(KeepAliveTransport())
        elif transport is None and base_url.startswith("https://") and not isinstance(verify, bool):
            # https, the same lean transport over TLS: the server verified against `verify` (an
            # `ssl.SSLContext` trusting the deployment's CA: common.tls.client_context).
            transport = tracing.traced_transport(KeepAliveTransport(verify))
        elif transport is None:
            # https with the system's trust store (verify=True): httpx's own transport.
            transport = httpx.AsyncHTTPTransport(verify=verify)  # traced as every httpx transport
        # `token`: this component's bearer credential (common.credentials), sent on every call.
        # Every request carries the caller's correlation id (common.correlation, bound by the
        # activity that asks), so the lock server's events for it carry the same id.
        self._http = httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            timeout=request_timeout_s,
            headers=auth_headers(token),
            event_hooks=httpx_hooks(),
        )
        self.session_id: str | None = None
        self.deadline = float("-inf")  # no session: nothing is held
        self._leases: set[Lease] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # Orphan reaping (see `_reap`): one turn per key (an acquire in flight or a reaper), the
        # token last handed to a caller per key (until the caller releases it), the reapers.
        self._turns: dict[str, _Turn] = {}
        self._issued: dict[str, int] = {}
        self._background = BackgroundReleases(self)
        self.http_attempts = 0  # requests sent, for tests and diagnostics

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
            asyncio.create_task(self._heartbeat_loop(), name="lock-heartbeat"),
            asyncio.create_task(self._watchdog_loop(), name="lock-watchdog"),
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
        self._session_lost("closed")
        closed = False
        if sid is not None:
            with contextlib.suppress(LockError, httpx.HTTPError):
                r = await self._http.delete(f"/v1/sessions/{sid}", timeout=2.0)
                closed = r.status_code == 204
        if owed:
            _log.warning(
                "lock.releases_left_at_close",
                count=owed,
                session_id=sid,
                session_closed=closed,
                grants_end="now, with the session" if closed else f"within {self.ttl_s}s (TTL)",
            )
        await self._http.aclose()

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
            async with self._turn(key, wait_s):
                requested = True
                lease = await self._acquire(key, give_up_at, attempts)
                self._issued[key] = lease.token
                return lease
        finally:
            if requested and lease is None:
                # A timeout, a lost connection or a cancellation may hide a grant the server
                # made to this session, possibly later still, when the server-side wait of a
                # request we gave up on ends: reap after that (see `_reap`).
                late = max(0.0, give_up_at - self.clock()) + self.request_timeout_s
                self._reap_later(key, late)

    @contextlib.asynccontextmanager
    async def _turn(self, key: str, wait_s: float | None) -> AsyncIterator[None]:
        """Exclusive use of `key` in this process (FIFO); NotAcquiredError after `wait_s`."""
        turn = self._turns.setdefault(key, _Turn())
        turn.users += 1
        try:
            try:
                if wait_s is None or turn.users == 1:
                    await turn.lock.acquire()  # nobody else: at once (wait_for(.., 0) would not)
                elif wait_s > 0:
                    await asyncio.wait_for(turn.lock.acquire(), wait_s)
                else:
                    raise TimeoutError
            except TimeoutError:
                raise NotAcquiredError(key, "timeout") from None
            try:
                yield
            finally:
                turn.lock.release()
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[key]

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
                data = await self._request(
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
                    self._session_lost("session_expired")
                if retry:
                    raise
                # This acquire held nothing yet, so one more try under a fresh session is safe
                # and spares the caller a backoff (a paused worker's waiters all fail at once).
                continue
            lease = Lease(grant_of(data), self, _signed_of(data))
            self._leases.add(lease)
            return lease
        raise AssertionError("unreachable")  # the loop returns or raises

    async def renew(self, lease: Lease) -> Lease:
        """Extend a still-valid grant; NotHeld (and the lost signal) otherwise (FR-06)."""
        try:
            data = await self._request("POST", "/v1/locks/renew", json=grant_body(lease.grant))
        except api.NotHeld:
            self._mark_lost(lease, "renew_refused")
            raise
        lease.grant = grant_of(data)
        lease.signed = _signed_of(data)
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
        if self._issued.get(lease.key) == lease.token:
            del self._issued[lease.key]  # the caller gave it up: a reaper may release it now
        try:
            await self._request("POST", "/v1/locks/release", json=grant_body(lease.grant))
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
            "leases_held": len(self._leases),
            "releases_pending": self._background.pending,
            "seconds_to_deadline": round(max(0.0, self.deadline - self.clock()), 3)
            if self.session_id is not None
            else None,
        }

    async def _open_session(self) -> None:
        sent = self.clock()
        data = await self._request("POST", "/v1/sessions", json={"ttl_s": self.ttl_s})
        self.session_id = str(data["session_id"])
        self.deadline = sent + self.local_ttl_s

    async def _ensure_session(self) -> None:
        if self.session_id is None:
            await self._open_session()
        elif self.clock() >= self.deadline and not await self._keepalive_once():
            # Our view of the session was stale and it is gone: a new one before a new lease.
            await self._open_session()

    async def _keepalive_once(self) -> bool:
        """One keepalive; True if it succeeded (and moved the deadline), False if the session is
        gone. Transport failures propagate as BackendUnavailable."""
        sid = self.session_id
        if sid is None:
            return False
        sent = self.clock()
        try:
            await self._request("POST", f"/v1/sessions/{sid}/keepalive", attempts=1)
        except api.SessionNotFound:
            self._session_lost("session_expired")
            return False
        if self.session_id == sid:
            self.deadline = max(self.deadline, sent + self.local_ttl_s)
        return True

    async def _heartbeat_loop(self) -> None:
        delay = self.heartbeat_s
        while True:
            await self._sleep(delay)
            if self.session_id is None:
                continue  # nothing to keep alive: the next acquire opens a new session
            try:
                ok = await self._keepalive_once()
                delay = self.heartbeat_s
                if not ok:
                    _log.warning("lock.session_expired", session_id=self.session_id)
            except LockError as exc:
                # Not proof of loss: retry soon; the deadline fires the lost signal if it lasts.
                delay = min(self.heartbeat_s, self._backoff(1))
                _log.warning(
                    "lock.heartbeat_failed",
                    error=exc.code,
                    why=str(exc)[:200] or type(exc).__name__,
                    session_id=self.session_id,
                    seconds_to_deadline=round(self.deadline - self.clock(), 3),
                )

    async def _watchdog_loop(self) -> None:
        """Fires the lost signal as soon as the local deadline passes (FR-12)."""
        while True:
            remaining = self.deadline - self.clock()
            if remaining <= 0:
                if self._leases:
                    self._session_lost("deadline")
                remaining = self.heartbeat_s / 4  # re-check after the next heartbeat chance
            await self._sleep(remaining)

    def _session_lost(self, reason: str) -> None:
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

    # ------------------------------------------------------------------ HTTP with bounded retry

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)], so retries never herd."""
        return full_jitter(
            attempt, base_s=self.backoff_base_s, cap_s=self.backoff_max_s, rng=self._rng
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        attempts: int | None = None,
        timeout_s: float | None = None,
        wait_in_body: bool = False,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """Bounded, jittered retries on transport errors and 503. `json` may be a callable,
        evaluated per attempt. With `wait_in_body`, each attempt's timeout adds the body's
        `wait_s`. With `deadline` (on `clock`), no attempt starts or runs past it."""
        tries = attempts if attempts is not None else self.attempts
        if tries < 1:
            raise api.InvalidRequest("attempts must be at least 1")
        last = "no attempt"
        for attempt in range(tries):
            if attempt:
                await self._sleep(self._backoff(attempt))
            body = json() if callable(json) else json
            timeout = timeout_s or self.request_timeout_s
            if wait_in_body and body is not None:
                timeout += float(body["wait_s"])
            if deadline is not None:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                timeout = min(timeout, remaining)
            self.http_attempts += 1
            try:
                resp = await self._http.request(method, path, json=body, timeout=timeout)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code == 503:
                # restore_detected is a 503 too: fail closed, but say which (the operator's cue).
                last = f"503 {_error_code(resp) or 'backend unavailable'}"
                continue
            return _decode(resp)
        raise api.BackendUnavailable(f"{method} {path} failed after {tries} attempts ({last})")


def retry_budget_s(
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
) -> float:
    """The longest the backoffs of one bounded call add up to: attempt `a` (from 1) waits at most
    `min(backoff_max_s, backoff_base_s * 2**a)` (full jitter), and against a server that refuses
    connections at once (a SIGKILLed lock server, nothing listening) the tries themselves take
    no time. A release that fails for longer than this becomes pending (`LockClient.release`).
    With the defaults: 0.1 + 0.2 + 0.4 = 0.7 s. Tests and the chaos harness derive outage
    lengths from it (docs/chaos.md)."""
    return float(sum(min(backoff_max_s, backoff_base_s * 2**a) for a in range(1, attempts)))


def _error_code(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def _decode(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code == 204:
        return {}
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if resp.is_success:
        return body
    code, message = str(body.get("code", "")), str(body.get("message", resp.text[:200]))
    if code == "not_acquired":
        raise NotAcquiredError("", str(body.get("reason")))
    if code in _ERROR_BY_CODE:
        raise _ERROR_BY_CODE[code](message)
    if resp.status_code in (400, 422):
        raise api.InvalidRequest(message)
    if resp.status_code in (401, 403):
        raise LockError(f"lock server refused this component's credential ({code}): {message}")
    raise LockError(f"unexpected {resp.status_code} from lock server: {message}")


def _signed_of(data: dict[str, Any]) -> SignedGrant | None:
    """The signed form of a grant answer; the SDK does not verify it (the resources do)."""
    if not data.get("signature") or not data.get("kid"):
        return None
    return SignedGrant.from_json(data)


__all__ = ["Lease", "LockClient", "NotAcquiredError", "retry_budget_s"]
