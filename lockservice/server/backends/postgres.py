"""PostgreSQL lock backend (asyncpg): sessions, grants and tokens in schema `lockservice`.

Owns the rows of `lockservice.*` for its key prefix. Must never: lower or delete a key's counter
(the token base, INV-04), grant a key whose current holder's session is still alive (INV-06), or
decide expiry with the client's clock (expiry is `clock_timestamp()` on the server).

Token = compose_token(epoch, counter): `key_counters.counter` is bumped with
`counter = counter + 1` under the row lock, so concurrent acquirers of one key are serialised by
PostgreSQL and every grant gets a fresh, higher counter.

A blocked acquirer sleeps until the first of: a NOTIFY for its key (release, revoke, close, epoch
bump; each wakes one of this process's waiters of the key, `wakeups`), the holder's session
expiry as the server reported it (a silent expiry sends no NOTIFY) plus a little jitter, its
deadline, or a safety cap. Finding a key held takes no row lock and writes nothing
(003_cheap_waiters.sql), so thousands of waiters stay cheap.

Here: sessions, the grant path (acquire, its wait, renew, release) and the NOTIFY listener.
Beside it: the operator actions, epoch bump and history reads (`postgres_operators`), what both
share (`postgres_common`), and the connection pool (`pgpool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from lockservice.api import (
    TOKEN_EPOCH_STRIDE,
    Grant,
    GrantRecord,
    IssuancePosition,
    LockInfo,
    NotAcquired,
    NotHeld,
    RevokeResult,
    Session,
    SessionNotFound,
    validate_key,
    validate_ttl,
    validate_wait,
)
from lockservice.server.backends import events
from lockservice.server.backends.pgpool import close_pool, open_pool
from lockservice.server.backends.postgres_common import (
    BACKEND,
    CHANNEL,
    CONNECTION_ERRORS,
    session_uuid,
    unavailable_on_connection_error,
)
from lockservice.server.backends.postgres_operators import PostgresOperators
from lockservice.server.backends.wakeups import Wakeups

#: Longest a blocked acquirer sleeps between attempts. NOTIFY wakes it on release, revoke, close
#: and epoch bump, and the holder's reported expiry wakes it for a silent expiry; this cap bounds
#: how late it notices a release whose NOTIFY was lost, e.g. one sent while the listener
#: connection was down and reconnecting after a database restart.
_WAIT_CAP_S = 5.0
#: Spread over a key's waiters, so they do not all call the database the instant its holder's
#: lease runs out.
_EXPIRY_JITTER_S = 0.05


#: A waiter's attempt (issue 29, the hot account's hand-off): the grant decision and, only when
#: it granted, the removal of the waiter's row, in one statement and one transaction, instead of
#: a second round trip between the grant and its answer. The CTE `granted` is referenced twice,
#: so PostgreSQL materialises it: acquire_grant runs exactly once.
_ACQUIRE_WAITING = (
    "WITH granted AS (SELECT * FROM lockservice.acquire_grant($1, $2, $3, $4)),"
    " dequeued AS (DELETE FROM lockservice.waiters WHERE waiter_id = $5"
    " AND (SELECT status FROM granted) = 'granted')"
    " SELECT * FROM granted"
)


class PostgresBackend:
    """LockBackend over one PostgreSQL database. Create with `await PostgresBackend.start(...)`."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        prefix: str,
        *,
        replica_id: str | None = None,
        wakeups: Wakeups | None = None,
    ) -> None:
        self._pool = pool
        self._url = database_url
        self._prefix = prefix
        #: The lock-server replica named in every audit row this backend writes (None: written
        #: by no lock server, e.g. the offline `bump-epoch`).
        self._replica_id = replica_id
        self._listener: asyncpg.Connection | None = None
        # One reconnect at a time: concurrent waiters would otherwise each open a listener
        # connection and all but the last would leak.
        self._reconnecting = asyncio.Lock()
        self._closed = False
        # Issue 29's hand-off A/B only: LOCK_PG_WAKE=all wakes every waiter per NOTIFY (before).
        self._wakeups = wakeups or Wakeups(wake_all=os.environ.get("LOCK_PG_WAKE") == "all")
        self._operators = PostgresOperators(pool, prefix, replica_id)

    @classmethod
    async def start(
        cls,
        database_url: str,
        prefix: str = "",
        *,
        replica_id: str | None = None,
        wakeups: Wakeups | None = None,
    ) -> PostgresBackend:
        from common.migrate import migrate

        with unavailable_on_connection_error():
            await migrate(database_url, schemas={"lockservice"})
            pool = await open_pool(database_url, size=10, command_timeout=10)
            await pool.execute(
                "INSERT INTO lockservice.epochs (prefix) VALUES ($1) ON CONFLICT DO NOTHING",
                prefix,
            )
        backend = cls(pool, database_url, prefix, replica_id=replica_id, wakeups=wakeups)
        await backend._ensure_listener()
        return backend

    # ------------------------------------------------------------------ helpers

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _listening(self) -> bool:
        return self._listener is not None and not self._listener.is_closed()

    async def _ensure_listener(self) -> None:
        """Best effort: without a listener, blocked acquirers still retry at the holder's expiry
        or after _WAIT_CAP_S. Returns at once while another caller is reconnecting, so that
        waiters never queue behind a slow connect."""
        if self._listening() or self._closed or self._reconnecting.locked():
            return
        async with self._reconnecting:
            if self._listening() or self._closed:
                return
            self._listener = None
            try:
                conn = await asyncpg.connect(self._url, timeout=5)
            except CONNECTION_ERRORS:
                return
            try:
                await conn.add_listener(CHANNEL, self._on_notify)
            except CONNECTION_ERRORS:
                conn.terminate()
                return
            if self._closed:  # close() ran while we connected: nobody would close this one
                conn.terminate()
                return
            self._listener = conn

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._wakeups.notify(payload)

    # ------------------------------------------------------------------ sessions

    async def open_session(self, ttl_s: float) -> Session:
        ttl = validate_ttl(ttl_s)
        sid = uuid.uuid4()
        with unavailable_on_connection_error():
            expires_at = await self._pool.fetchval(
                "INSERT INTO lockservice.sessions (session_id, ttl, expires_at)"
                " SELECT $1, t, clock_timestamp() + t FROM make_interval(secs => $2) AS t"
                " RETURNING expires_at",
                sid,
                ttl,
            )
        return Session(session_id=str(sid), ttl_s=ttl, expires_at=expires_at)

    async def keepalive(self, session_id: str) -> Session:
        sid = session_uuid(session_id)
        if sid is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        with unavailable_on_connection_error():
            row = await self._pool.fetchrow(
                "UPDATE lockservice.sessions SET expires_at = clock_timestamp() + ttl"
                " WHERE session_id = $1 AND expires_at > clock_timestamp()"
                " RETURNING ttl, expires_at",
                sid,
            )
        if row is None:
            raise SessionNotFound(f"session {session_id} is unknown or expired")
        ttl: timedelta = row["ttl"]
        return Session(
            session_id=session_id, ttl_s=ttl.total_seconds(), expires_at=row["expires_at"]
        )

    async def close_session(self, session_id: str) -> None:
        sid = session_uuid(session_id)
        if sid is None:
            return
        with unavailable_on_connection_error():
            # One call: ends each grant (history: session_closed, or expired at the session's
            # expiry), notifies its waiters, drops the session (002_grant_functions.sql).
            await self._pool.fetchval("SELECT lockservice.close_session($1)", sid)

    # ------------------------------------------------------------------ grants

    async def acquire(self, session_id: str, key: str, wait_s: float) -> Grant | NotAcquired:
        validate_key(key)
        wait = validate_wait(wait_s)
        sid = session_uuid(session_id)
        if sid is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        full = self._full(key)
        if wait == 0:
            return (await self._try_acquire(sid, key, full))[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        # Registered and listening BEFORE the first attempt: a release that commits after that
        # attempt read the holder always wakes a waiter of the key (the oldest one not awake,
        # `Wakeups`), even though we then sleep for seconds.
        wake = self._wakeups.join(full)
        result: Grant | NotAcquired | None = None
        try:
            await self._ensure_listener()
            result = await self._wait_for_grant(sid, key, full, deadline, wake)
            return result
        finally:
            # Leaving without a grant after a wake-up we may have used up (cancelled or failed
            # before or during the attempt it caused, or out of time with one pending): the next
            # waiter gets it, or a free key could wait with every waiter asleep.
            used_up = result is None or wake.is_set()
            self._wakeups.leave(full, wake, hand_on=not isinstance(result, Grant) and used_up)

    async def _wait_for_grant(
        self, sid: uuid.UUID, key: str, full: str, deadline: float, wake: asyncio.Event
    ) -> Grant | NotAcquired:
        """Attempt; while held, sleep until a wake-up (see the module docstring) and retry."""
        loop = asyncio.get_running_loop()
        result, holder_expires_in = await self._try_acquire(sid, key, full)
        if isinstance(result, Grant):
            return result
        # Blocked: count as a waiter of the key until we return (inspect().waiters).
        waiter_id = uuid.uuid4()
        with unavailable_on_connection_error():
            await self._pool.execute(
                "INSERT INTO lockservice.waiters (key, session_id, waiter_id) VALUES ($1, $2, $3)",
                full,
                sid,
                waiter_id,
            )
        removed = False
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return NotAcquired(key=key, reason="timeout")
                nap = min(remaining, _WAIT_CAP_S)
                if holder_expires_in is not None:
                    nap = min(nap, holder_expires_in + random.uniform(0, _EXPIRY_JITTER_S))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), nap)
                # After a database restart the listener is gone; NOTIFYs sent before it is back
                # are lost, which the attempt below (made after it listens again) makes up for.
                await self._ensure_listener()
                # Cleared before the attempt, so a NOTIFY arriving during it is not lost.
                wake.clear()
                result, holder_expires_in = await self._try_acquire(
                    sid, key, full, waiter_id=waiter_id
                )
                if isinstance(result, Grant):
                    removed = True  # by the statement that granted it, in its transaction
                    return result
        finally:
            if not removed:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await self._pool.execute(
                        "DELETE FROM lockservice.waiters WHERE waiter_id = $1", waiter_id
                    )

    async def _try_acquire(
        self, sid: uuid.UUID, key: str, full: str, *, waiter_id: uuid.UUID | None = None
    ) -> tuple[Grant | NotAcquired, float | None]:
        """One attempt; when the key is held, also the seconds until its holder's session
        expires on the server's clock (unless kept alive). A blocked acquirer's attempt names
        its `waiter_id`: a grant removes that waiter row in the same statement."""
        with unavailable_on_connection_error():
            # One round trip: the whole grant decision is one plpgsql function, one transaction
            # (003_cheap_waiters.sql): a lock-free read answers 'held'; otherwise epoch FOR SHARE,
            # counter row FOR UPDATE (serialises the key's acquirers and revokers), holder
            # re-check, counter + 1, holder and history rows.
            if waiter_id is None:
                row = await self._pool.fetchrow(
                    "SELECT * FROM lockservice.acquire_grant($1, $2, $3, $4)",
                    self._prefix,
                    full,
                    sid,
                    TOKEN_EPOCH_STRIDE,
                )
            else:
                row = await self._pool.fetchrow(
                    _ACQUIRE_WAITING, self._prefix, full, sid, TOKEN_EPOCH_STRIDE, waiter_id
                )
        if row["status"] == "no_session":
            raise SessionNotFound(f"session {sid} is unknown or expired")
        if row["status"] == "held":
            expires_in: float = row["holder_expires_in"]
            return NotAcquired(key=key, reason="held"), expires_in
        if row["expired_token"] is not None:
            events.expired(BACKEND, key, row["expired_token"], str(row["expired_session"]))
        token: int = row["token"]
        events.acquired(BACKEND, key, token, str(sid))
        grant = Grant(
            key=key,
            token=token,
            session_id=str(sid),
            acquired_at=row["acquired_at"],
            expires_at=row["expires_at"],
        )
        return grant, None

    async def renew(self, grant: Grant) -> Grant:
        validate_key(grant.key)
        sid = session_uuid(grant.session_id)
        row = None
        if sid is not None:
            with unavailable_on_connection_error():
                # Extends the session only while this exact grant is still its key's valid grant.
                row = await self._pool.fetchrow(
                    "UPDATE lockservice.sessions s SET expires_at = clock_timestamp() + s.ttl"
                    " FROM lockservice.holders h"
                    " WHERE h.key = $1 AND h.session_id = $2 AND h.token = $3"
                    " AND s.session_id = h.session_id AND s.expires_at > clock_timestamp()"
                    " RETURNING s.expires_at, h.acquired_at",
                    self._full(grant.key),
                    sid,
                    grant.token,
                )
        if row is None:
            events.renew_failed(BACKEND, grant.key, grant.token, grant.session_id)
            raise NotHeld(f"grant {grant.token} on {grant.key!r} is no longer valid")
        return Grant(
            key=grant.key,
            token=grant.token,
            session_id=grant.session_id,
            acquired_at=row["acquired_at"],
            expires_at=row["expires_at"],
        )

    async def release(self, grant: Grant) -> None:
        validate_key(grant.key)
        sid = session_uuid(grant.session_id)
        released = False
        if sid is not None:
            with unavailable_on_connection_error():
                # Compare-and-delete on (key, session, token) of a still-valid grant (FR-05),
                # history row and NOTIFY in the same call (release_grant).
                released = await self._pool.fetchval(
                    "SELECT lockservice.release_grant($1, $2, $3)",
                    self._full(grant.key),
                    sid,
                    grant.token,
                )
        if not released:
            raise NotHeld(f"grant {grant.token} on {grant.key!r} is no longer valid")
        events.released(BACKEND, grant.key, grant.token, grant.session_id)

    # ------------------------------------------------------------------ operators and history
    # (lockservice.server.backends.postgres_operators)

    async def inspect(self, key: str) -> LockInfo:
        return await self._operators.inspect(key)

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult:
        return await self._operators.force_revoke(key, operator, reason)

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        return await self._operators.bump_epoch(
            min_epoch, operator, reason, highest_fence_seen=highest_fence_seen
        )

    async def issuance_position(self, since: int = 0) -> IssuancePosition:
        return await self._operators.issuance_position(since)

    async def highest_token_issued(self) -> int:
        return await self._operators.highest_token_issued()

    async def history_retained_since(self) -> datetime | None:
        return await self._operators.history_retained_since()

    async def grant_history(
        self, key_prefix: str = "", *, limit: int | None = None
    ) -> list[GrantRecord]:
        return await self._operators.grant_history(key_prefix, limit=limit)

    async def audit_records(self) -> list[dict[str, Any]]:
        return await self._operators.audit_records()

    async def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._listener.close(timeout=2)
            self._listener = None
        await close_pool(self._pool)  # terminates what cannot close politely (a stopped server)
