"""A FAKE in-memory LockBackend, only for unit tests of the HTTP layer and the SDK's timing logic.

It follows the contract's observable rules closely enough for those tests (session expiry on its
own controllable clock, one grant per key, increasing tokens, compare-and-delete release), but it
is not a backend: integration tests use the real PostgreSQL and etcd backends.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lockservice import api
from lockservice.api import Grant, GrantRecord, LockInfo, NotAcquired, RevokeResult, Session


@dataclass
class FakeBackend:
    clock: Callable[[], float] = time.monotonic
    sessions: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> (ttl, expiry)
    held: dict[str, Grant] = field(default_factory=dict)
    last_token: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    issued: list[Grant] = field(default_factory=list)
    unavailable: bool = False
    #: Every acquire first finds its session gone (a client that keeps losing its sessions).
    drop_sessions_on_acquire: bool = False
    calls: list[str] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _check(self, op: str) -> None:
        self.calls.append(op)
        if self.unavailable:
            raise api.BackendUnavailable("fake backend is down")

    def _now(self) -> datetime:
        return datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=self.clock())

    def _expire(self) -> None:
        now = self.clock()
        for sid, (_ttl, expiry) in list(self.sessions.items()):
            if expiry <= now:
                del self.sessions[sid]
        for key, g in list(self.held.items()):
            if g.session_id not in self.sessions:
                del self.held[key]

    def _session(self, sid: str) -> Session:
        ttl, expiry = self.sessions[sid]
        return Session(sid, ttl, self._now() + timedelta(seconds=expiry - self.clock()))

    async def open_session(self, ttl_s: float) -> Session:
        self._check("open_session")
        sid = uuid.uuid4().hex
        self.sessions[sid] = (api.validate_ttl(ttl_s), self.clock() + ttl_s)
        return self._session(sid)

    async def keepalive(self, session_id: str) -> Session:
        self._check("keepalive")
        self._expire()
        if session_id not in self.sessions:
            raise api.SessionNotFound(session_id)
        ttl, _ = self.sessions[session_id]
        self.sessions[session_id] = (ttl, self.clock() + ttl)
        return self._session(session_id)

    async def close_session(self, session_id: str) -> None:
        self._check("close_session")
        self.sessions.pop(session_id, None)
        self._expire()

    async def acquire(self, session_id: str, key: str, wait_s: float) -> Grant | NotAcquired:
        self._check("acquire")
        self._expire()
        if self.drop_sessions_on_acquire:
            self.sessions.pop(session_id, None)
        if session_id not in self.sessions:
            raise api.SessionNotFound(session_id)
        if key in self.held:
            return NotAcquired(key, "held" if wait_s == 0 else "timeout")
        token = api.compose_token(self.epoch, next(self._seq))
        self.last_token[key] = token
        g = Grant(key, token, session_id, self._now(), self._session(session_id).expires_at)
        self.held[key] = g
        self.issued.append(g)
        return g

    async def renew(self, grant: Grant) -> Grant:
        self._check("renew")
        self._expire()
        current = self.held.get(grant.key)
        if current is None or (current.token, current.session_id) != (
            grant.token,
            grant.session_id,
        ):
            raise api.NotHeld(grant.key)
        return current

    async def release(self, grant: Grant) -> None:
        await self.renew(grant)
        del self.held[grant.key]

    async def inspect(self, key: str) -> LockInfo:
        self._check("inspect")
        self._expire()
        g = self.held.get(key)
        return LockInfo(
            key,
            g.session_id if g else None,
            g.token if g else None,
            g.acquired_at if g else None,
            g.expires_at if g else None,
            0,
            self.last_token.get(key),
        )

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult:
        self._check("force_revoke")
        operator, reason = api.validate_operator(operator, reason)
        g = self.held.pop(key, None)
        next(self._seq)  # the next token is higher than the revoked one
        return RevokeResult(key, g.token if g else None, operator, reason, self._now())

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        self._check("bump_epoch")
        self.epoch = api.next_epoch(self.epoch, min_epoch, highest_fence_seen)
        return self.epoch

    async def issuance_position(self, since: int = 0) -> api.IssuancePosition:
        self._check("issuance_position")
        return api.IssuancePosition(self.epoch, len(self.issued))

    async def highest_token_issued(self) -> int:
        return max((g.token for g in self.issued), default=0)

    async def grant_history(
        self, key_prefix: str = "", *, limit: int | None = None
    ) -> list[GrantRecord]:
        """Grants issued, without end tracking (the HTTP tests only need the shape)."""
        self._check("grant_history")
        recs = sorted(
            (
                GrantRecord(g.key, g.token, g.session_id, g.acquired_at, None, None)
                for g in self.issued
            ),
            key=lambda r: (r.key, r.token),
        )
        return [r for r in recs if r.key.startswith(key_prefix)][:limit]

    async def history_retained_since(self) -> datetime | None:
        return None

    async def close(self) -> None:
        return None
