"""The SDK's background releases (`lockservice.sdk.client`): grants the server may still hold for
this process's session although no caller will release them any more.

Why: the session is process-wide and its heartbeat keeps it alive, so a grant that nobody
releases never expires, and every later payout of its account waits for ever (issue 24 item 6:
a lock-server outage longer than a release's bounded retries and shorter than the session TTL
left accounts blocked until an operator revoked). So nothing here gives up while the session
that holds the grant lives.

Owns: the releases this process still owes the server (`keep`: a release that did not get its
answer, retried until it succeeds or the session ends), the orphan reapers (`reap_later`: an
acquire whose answer may hide a grant), their events (`lock.release_pending`, and one per
outcome: `lock.release_recovered`, `lock.release_already_ended`, `lock.release_session_ended`;
`lock.orphan_released`) and metrics (`lock_client_releases_pending`,
`lock_client_pending_releases_total{outcome}`; no label carries a key, token or session).
Must never: release a grant a caller holds, or end any grant but the one it was given. Every
release is the server's compare-and-delete on (key, session, token): a retry after the server
did release (its answer was lost), or after the grant ended otherwise (expiry, revoke), or
while a newer grant of the key is held by the same session, is refused as `not_held` and
changes nothing. Safety never depends on any of this: a grant nobody holds protects nothing,
and the resources fence every stale token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, Protocol
from urllib.parse import quote

import httpx
from prometheus_client import Counter, Gauge

from common.logs import get_logger
from lockservice import api
from lockservice.api import Grant, LockError
from lockservice.sdk.calls import BoundedCalls
from lockservice.sdk.turns import KeyTurns

_log = get_logger("lockservice.client")

#: How a pending release ended: the retry released it; the server no longer held it (the first
#: try did release and its answer was lost, or the grant expired or was revoked); the session
#: that held it ended (its grants with it); the client closed (closing the session ends them).
Outcome = Literal["released", "already_ended", "session_ended", "closed"]

RELEASES_PENDING = Gauge(
    "lock_client_releases_pending",
    "Releases this process still owes the lock server, retried until they succeed or the"
    " session ends.",
)
PENDING_OUTCOMES = Counter(
    "lock_client_pending_releases_total", "Pending releases by how they ended.", ["outcome"]
)
_EVENTS: dict[Outcome, str] = {
    "released": "lock.release_recovered",
    "already_ended": "lock.release_already_ended",
    "session_ended": "lock.release_session_ended",
}


class ReleaseOwner(Protocol):
    """What the background releases read and use of their client (`LockClient`): its session,
    clock, bounded calls, per-key turns and the tokens handed to callers. A Protocol, so that this
    module need not import the client that imports it."""

    @property
    def session_id(self) -> str | None: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def calls(self) -> BoundedCalls: ...
    @property
    def turns(self) -> KeyTurns: ...
    @property
    def issued(self) -> dict[str, int]: ...


class BackgroundReleases:
    """The pending releases and reapers of one `LockClient` (which owns one and delegates)."""

    def __init__(self, client: ReleaseOwner) -> None:
        self._client = client
        self._reapers: set[asyncio.Task[None]] = set()
        self._pending: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.orphans_released = 0  # for tests and diagnostics

    @property
    def reaping(self) -> int:
        """Reapers still running (for tests and diagnostics)."""
        return len(self._reapers)

    @property
    def pending(self) -> int:
        """Releases still owed to the server."""
        return len(self._pending)

    def tasks(self) -> set[asyncio.Task[None]]:
        """Every background task still running (the client cancels them when it closes)."""
        return set(self._reapers) | set(self._pending.values())

    # ------------------------------------------------------------------ pending releases

    def keep(self, grant: Grant, why: str) -> None:
        """A release of `grant` did not get its answer: retry it until it succeeds or the
        session ends. A grant of a session this client no longer uses is not kept: that
        session ended, or expires at its TTL now that nothing heartbeats it."""
        c = self._client
        if c.session_id != grant.session_id or (grant.key, grant.token) in self._pending:
            return
        task = asyncio.create_task(
            self._owed(grant), name=f"lock-release:{grant.key}:{grant.token}"
        )
        self._pending[(grant.key, grant.token)] = task
        RELEASES_PENDING.inc()
        _log.warning(
            "lock.release_pending",
            key=grant.key,
            token=grant.token,
            session_id=grant.session_id,
            why=why[:200],
        )

    async def _owed(self, grant: Grant) -> None:
        c = self._client
        started, retries = c.clock(), [0]
        outcome: Outcome = "closed"
        try:
            outcome = await self._retry_release(grant, retries)
        finally:
            self._pending.pop((grant.key, grant.token), None)
            RELEASES_PENDING.dec()
            PENDING_OUTCOMES.labels(outcome=outcome).inc()
            if outcome != "closed":  # the client's close reports what it left
                _log.warning(
                    _EVENTS[outcome],
                    key=grant.key,
                    token=grant.token,
                    session_id=grant.session_id,
                    retries=retries[0],
                    pending_s=round(c.clock() - started, 3),
                )

    async def _retry_release(self, grant: Grant, retries: list[int]) -> Outcome:
        """The compare-and-delete of `grant`, one attempt at a time with full-jitter backoff
        (capped at the client's `backoff_max_s`), for as long as its session is this client's."""
        c = self._client
        while True:
            retries[0] += 1
            await c.calls.sleep(c.calls.backoff(retries[0]))
            if c.session_id != grant.session_id:
                return "session_ended"
            try:
                await c.calls.request(
                    "POST", "/v1/locks/release", json=grant_body(grant), attempts=1
                )
            except api.NotHeld:
                return "already_ended"
            except (LockError, httpx.HTTPError):
                continue  # the server is still away: its session outlives this, or ends it
            return "released"

    # ------------------------------------------------------------------ orphaned grants

    def reap_later(self, key: str, delay_s: float) -> None:
        task = asyncio.create_task(self._reap(key, delay_s), name=f"lock-reap:{key}")
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _reap(self, key: str, delay_s: float) -> None:
        """Release a grant the server holds for this session that no caller knows about.

        One appears when an acquire's answer is lost after the server granted it (a timeout, a
        reset connection, a lock-server restart, a cancelled caller; the server may even grant
        after the client gave up, until its own wait ends). So the reaper first waits out the
        failed request's server-side wait (`delay_s`), then takes the key's turn, so no acquire
        of the key is in flight in this process, and releases a grant whose holder is this
        session under a token no caller holds; while the server cannot answer, it keeps asking
        for as long as the session lives.
        """
        c = self._client
        await c.calls.sleep(delay_s)
        async with c.turns.turn(key, None):
            await self._release_orphan(key)

    async def _release_orphan(self, key: str) -> None:
        c = self._client
        sid, attempt = c.session_id, 0
        while sid is not None and c.session_id == sid:  # no session: its grants ended with it
            if attempt:
                await c.calls.sleep(c.calls.backoff(attempt))
            attempt += 1
            try:
                info = await c.calls.request("GET", f"/v1/locks?key={quote(key)}", attempts=1)
            except (LockError, httpx.HTTPError):
                continue
            token = info.get("token")
            if info.get("holder_session") != sid or token is None:
                return
            if c.issued.get(key) == token:
                return  # a caller holds it
            body = grant_body(grant_of({**info, "session_id": sid}))
            try:
                await c.calls.request("POST", "/v1/locks/release", json=body, attempts=1)
            except api.NotHeld:
                return
            except (LockError, httpx.HTTPError):
                continue
            self.orphans_released += 1
            _log.warning("lock.orphan_released", key=key, token=token, session_id=sid)
            return


def grant_of(data: dict[str, Any]) -> Grant:
    """A grant from the server's JSON answer (acquire, renew, inspect + the session id)."""
    return Grant(
        key=str(data["key"]),
        token=int(data["token"]),
        session_id=str(data["session_id"]),
        acquired_at=datetime.fromisoformat(str(data["acquired_at"])),
        expires_at=datetime.fromisoformat(str(data["expires_at"])),
    )


def grant_body(g: Grant) -> dict[str, Any]:
    """A grant as the renew and release routes take it."""
    return {
        "key": g.key,
        "token": g.token,
        "session_id": g.session_id,
        "acquired_at": g.acquired_at.isoformat(),
        "expires_at": g.expires_at.isoformat(),
    }
