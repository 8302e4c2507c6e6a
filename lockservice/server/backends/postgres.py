"""PostgreSQL lock backend (asyncpg): sessions, grants and tokens in schema `lockservice`.

Owns the rows of `lockservice.*` for its key prefix. Must never: lower or delete a key's counter
(the token base, INV-04), grant a key whose current holder's session is still alive (INV-06), or
decide expiry with the client's clock (expiry is `clock_timestamp()` on the server).

Token = compose_token(epoch, counter): `key_counters.counter` is bumped with
`counter = counter + 1` under the row lock, so concurrent acquirers of one key are serialised by
PostgreSQL and every grant gets a fresh, higher counter.

A blocked acquirer sleeps until the first of: a NOTIFY for its key (release, revoke, close, epoch
bump), the holder's session expiry as the server reported it (a silent expiry sends no NOTIFY)
plus a little jitter, its deadline, or a safety cap. Finding a key held takes no row lock and
writes nothing (003_cheap_waiters.sql), so thousands of waiters stay cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from common.outage import CONNECTION_LOST, connection_lost
from lockservice.api import (
    TOKEN_EPOCH_STRIDE,
    BackendUnavailable,
    Grant,
    GrantRecord,
    InvalidRequest,
    IssuancePosition,
    LockInfo,
    NotAcquired,
    NotHeld,
    RevokeResult,
    Session,
    SessionNotFound,
    validate_key,
    validate_operator,
    validate_ttl,
    validate_wait,
)
from lockservice.api import next_epoch as _next_epoch
from lockservice.server.backends import events
from lockservice.server.backends.pgpool import close_pool, open_pool

_BACKEND = "postgres"
_CHANNEL = "lockservice_release"
#: Longest a blocked acquirer sleeps between attempts. NOTIFY wakes it on release, revoke, close
#: and epoch bump, and the holder's reported expiry wakes it for a silent expiry; this cap bounds
#: how late it notices a release whose NOTIFY was lost, e.g. one sent while the listener
#: connection was down and reconnecting after a database restart.
_WAIT_CAP_S = 5.0
#: Spread over a key's waiters, so they do not all call the database the instant its holder's
#: lease runs out.
_EXPIRY_JITTER_S = 0.05
#: A lost, closing or refused connection (common.outage), e.g. one the server dropped while it
#: sat idle, used before its EOF was read (asyncpg's Pool terminates it; the next call gets a new
#: one).
_CONNECTION_ERRORS = CONNECTION_LOST


@contextlib.contextmanager
def _unavailable_on_connection_error() -> Iterator[None]:
    """Callers fail closed on BackendUnavailable (FR-27); never leak driver exceptions."""
    try:
        yield
    except _CONNECTION_ERRORS as exc:
        if not connection_lost(exc):
            raise
        raise BackendUnavailable(f"postgres lock backend unreachable: {exc!r}") from exc


def _session_uuid(session_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(session_id)
    except (ValueError, TypeError, AttributeError):
        return None


class PostgresBackend:
    """LockBackend over one PostgreSQL database. Create with `await PostgresBackend.start(...)`."""

    def __init__(
        self, pool: asyncpg.Pool, database_url: str, prefix: str, *, replica_id: str | None = None
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
        self._wakeups: dict[str, set[asyncio.Event]] = {}

    @classmethod
    async def start(
        cls, database_url: str, prefix: str = "", *, replica_id: str | None = None
    ) -> PostgresBackend:
        from common.migrate import migrate

        with _unavailable_on_connection_error():
            await migrate(database_url, schemas={"lockservice"})
            pool = await open_pool(database_url, size=10, command_timeout=10)
            await pool.execute(
                "INSERT INTO lockservice.epochs (prefix) VALUES ($1) ON CONFLICT DO NOTHING",
                prefix,
            )
        backend = cls(pool, database_url, prefix, replica_id=replica_id)
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
            except _CONNECTION_ERRORS:
                return
            try:
                await conn.add_listener(_CHANNEL, self._on_notify)
            except _CONNECTION_ERRORS:
                conn.terminate()
                return
            if self._closed:  # close() ran while we connected: nobody would close this one
                conn.terminate()
                return
            self._listener = conn

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for event in self._wakeups.get(payload, ()):
            event.set()

    # ------------------------------------------------------------------ sessions

    async def open_session(self, ttl_s: float) -> Session:
        ttl = validate_ttl(ttl_s)
        sid = uuid.uuid4()
        with _unavailable_on_connection_error():
            expires_at = await self._pool.fetchval(
                "INSERT INTO lockservice.sessions (session_id, ttl, expires_at)"
                " SELECT $1, t, clock_timestamp() + t FROM make_interval(secs => $2) AS t"
                " RETURNING expires_at",
                sid,
                ttl,
            )
        return Session(session_id=str(sid), ttl_s=ttl, expires_at=expires_at)

    async def keepalive(self, session_id: str) -> Session:
        sid = _session_uuid(session_id)
        if sid is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        with _unavailable_on_connection_error():
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
        sid = _session_uuid(session_id)
        if sid is None:
            return
        with _unavailable_on_connection_error():
            # One call: ends each grant (history: session_closed, or expired at the session's
            # expiry), notifies its waiters, drops the session (002_grant_functions.sql).
            await self._pool.fetchval("SELECT lockservice.close_session($1)", sid)

    # ------------------------------------------------------------------ grants

    async def acquire(self, session_id: str, key: str, wait_s: float) -> Grant | NotAcquired:
        validate_key(key)
        wait = validate_wait(wait_s)
        sid = _session_uuid(session_id)
        if sid is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        full = self._full(key)
        if wait == 0:
            return (await self._try_acquire(sid, key, full))[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        wake = asyncio.Event()
        # Registered and listening BEFORE the first attempt: a release that commits after that
        # attempt read the holder always sets `wake`, even though we then sleep for seconds.
        self._wakeups.setdefault(full, set()).add(wake)
        try:
            await self._ensure_listener()
            return await self._wait_for_grant(sid, key, full, deadline, wake)
        finally:
            waiting = self._wakeups.get(full)
            if waiting is not None:
                waiting.discard(wake)
                if not waiting:
                    del self._wakeups[full]

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
        with _unavailable_on_connection_error():
            await self._pool.execute(
                "INSERT INTO lockservice.waiters (key, session_id, waiter_id) VALUES ($1, $2, $3)",
                full,
                sid,
                waiter_id,
            )
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
                result, holder_expires_in = await self._try_acquire(sid, key, full)
                if isinstance(result, Grant):
                    return result
        finally:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await self._pool.execute(
                    "DELETE FROM lockservice.waiters WHERE waiter_id = $1", waiter_id
                )

    async def _try_acquire(
        self, sid: uuid.UUID, key: str, full: str
    ) -> tuple[Grant | NotAcquired, float | None]:
        """One attempt; when the key is held, also the seconds until its holder's session
        expires on the server's clock (unless kept alive)."""
        with _unavailable_on_connection_error():
            # One round trip: the whole grant decision is one plpgsql function, one transaction
            # (003_cheap_waiters.sql): a lock-free read answers 'held'; otherwise epoch FOR SHARE,
            # counter row FOR UPDATE (serialises the key's acquirers and revokers), holder
            # re-check, counter + 1, holder and history rows.
            row = await self._pool.fetchrow(
                "SELECT * FROM lockservice.acquire_grant($1, $2, $3, $4)",
                self._prefix,
                full,
                sid,
                TOKEN_EPOCH_STRIDE,
            )
        if row["status"] == "no_session":
            raise SessionNotFound(f"session {sid} is unknown or expired")
        if row["status"] == "held":
            expires_in: float = row["holder_expires_in"]
            return NotAcquired(key=key, reason="held"), expires_in
        if row["expired_token"] is not None:
            events.expired(_BACKEND, key, row["expired_token"], str(row["expired_session"]))
        token: int = row["token"]
        events.acquired(_BACKEND, key, token, str(sid))
        grant = Grant(
            key=key,
            token=token,
            session_id=str(sid),
            acquired_at=row["acquired_at"],
            expires_at=row["expires_at"],
        )
        return grant, None

    @staticmethod
    async def _end_history(
        conn: asyncpg.Connection, full: str, token: int, reason: str, session_expires: Any
    ) -> None:
        """A grant of an already expired session ended at its expiry, not now (end_grant)."""
        await conn.execute(
            "SELECT lockservice.end_grant($1, $2, $3, $4)", full, token, reason, session_expires
        )

    async def renew(self, grant: Grant) -> Grant:
        validate_key(grant.key)
        sid = _session_uuid(grant.session_id)
        row = None
        if sid is not None:
            with _unavailable_on_connection_error():
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
            events.renew_failed(_BACKEND, grant.key, grant.token, grant.session_id)
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
        sid = _session_uuid(grant.session_id)
        released = False
        if sid is not None:
            with _unavailable_on_connection_error():
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
        events.released(_BACKEND, grant.key, grant.token, grant.session_id)

    # ------------------------------------------------------------------ operators

    async def inspect(self, key: str) -> LockInfo:
        validate_key(key)
        full = self._full(key)
        with _unavailable_on_connection_error():
            row = await self._pool.fetchrow(
                "SELECT kc.last_token, h.session_id, h.token, h.acquired_at, s.expires_at,"
                " (SELECT count(DISTINCT w.session_id) FROM lockservice.waiters w"
                "   JOIN lockservice.sessions ws ON ws.session_id = w.session_id"
                "   WHERE w.key = $1 AND ws.expires_at > clock_timestamp()) AS waiters"
                " FROM (SELECT $1::text AS key) k"
                " LEFT JOIN lockservice.key_counters kc ON kc.key = k.key"
                " LEFT JOIN lockservice.holders h ON h.key = k.key"
                " LEFT JOIN lockservice.sessions s ON s.session_id = h.session_id"
                "   AND s.expires_at > clock_timestamp()",
                full,
            )
        held = row["expires_at"] is not None
        return LockInfo(
            key=key,
            holder_session=str(row["session_id"]) if held else None,
            token=row["token"] if held else None,
            acquired_at=row["acquired_at"] if held else None,
            expires_at=row["expires_at"] if held else None,
            waiters=int(row["waiters"]),
            last_token=row["last_token"],
        )

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult:
        validate_key(key)
        operator, reason = validate_operator(operator, reason)
        full = self._full(key)
        with _unavailable_on_connection_error():
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO lockservice.key_counters (key) VALUES ($1) ON CONFLICT DO NOTHING",
                    full,
                )
                await conn.execute(
                    "SELECT 1 FROM lockservice.key_counters WHERE key = $1 FOR UPDATE", full
                )
                holder = await conn.fetchrow(
                    "WITH gone AS (DELETE FROM lockservice.holders h WHERE h.key = $1"
                    "   RETURNING h.token, h.session_id)"
                    " SELECT g.token, s.expires_at,"
                    " coalesce(s.expires_at > clock_timestamp(), false) AS valid"
                    " FROM gone g LEFT JOIN lockservice.sessions s ON s.session_id = g.session_id",
                    full,
                )
                revoked: int | None = None
                if holder is not None:
                    # An expired holder's history row ends at its expiry ('expired'), not now.
                    await self._end_history(
                        conn, full, holder["token"], "revoked", holder["expires_at"]
                    )
                    revoked = holder["token"] if holder["valid"] else None
                # The next token is higher by construction: the counter is never lowered.
                at: datetime = await conn.fetchval(
                    "INSERT INTO lockservice.audit (prefix, action, key, operator, reason, detail)"
                    " VALUES ($1, 'force_revoke', $2, $3, $4, $5::jsonb) RETURNING at",
                    self._prefix,
                    key,
                    operator,
                    reason,
                    json.dumps({"revoked_token": revoked, "replica": self._replica_id}),
                )
                await conn.execute("SELECT pg_notify($1, $2)", _CHANNEL, full)
        events.revoked(_BACKEND, key, revoked, operator, reason, replica=self._replica_id)
        return RevokeResult(key=key, revoked_token=revoked, operator=operator, reason=reason, at=at)

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        operator, reason = validate_operator(operator, reason)
        with _unavailable_on_connection_error():
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO lockservice.epochs (prefix) VALUES ($1) ON CONFLICT DO NOTHING",
                    self._prefix,
                )
                old: int = await conn.fetchval(
                    "SELECT epoch FROM lockservice.epochs WHERE prefix = $1 FOR UPDATE",
                    self._prefix,
                )
                # Bounded (raises before any write; the transaction rolls back).
                new = _next_epoch(old, min_epoch, highest_fence_seen)
                await conn.execute(
                    "UPDATE lockservice.epochs SET epoch = $2 WHERE prefix = $1", self._prefix, new
                )
                # Grants restored from a backup belong to the past: end them all.
                ended = await conn.fetch(
                    "WITH gone AS (DELETE FROM lockservice.holders WHERE starts_with(key, $1)"
                    "   RETURNING key, token, session_id)"
                    " SELECT g.key, g.token, s.expires_at FROM gone g"
                    " LEFT JOIN lockservice.sessions s ON s.session_id = g.session_id",
                    self._prefix,
                )
                for row in ended:
                    await self._end_history(
                        conn, row["key"], row["token"], "epoch_bumped", row["expires_at"]
                    )
                    await conn.execute("SELECT pg_notify($1, $2)", _CHANNEL, row["key"])
                await conn.execute(
                    "INSERT INTO lockservice.audit (prefix, action, operator, reason, detail)"
                    " VALUES ($1, 'bump_epoch', $2, $3, $4::jsonb)",
                    self._prefix,
                    operator,
                    reason,
                    json.dumps(
                        {
                            "old_epoch": old,
                            "new_epoch": new,
                            "min_epoch": min_epoch,
                            "highest_fence_seen": highest_fence_seen,
                            "replica": self._replica_id,
                        }
                    ),
                )
        events.epoch_bumped(
            _BACKEND,
            old,
            new,
            operator,
            reason,
            highest_fence_seen=highest_fence_seen,
            replica=self._replica_id,
        )
        return new

    async def issuance_position(self, since: int = 0) -> IssuancePosition:
        """Every grant inserts a grant_history row, so the row id sequence only rises, across
        every prefix; a pg_dump/restore (or a restored data dir) sets it back.

        The sequence alone misses grants lost in a failover: it is WAL-logged up to 32 values
        ahead, so the promoted standby's sequence can stand above the ids it never received.
        The anchor is a committed row (the highest grant_history id; the table is never
        pruned), and `lost` says whether the row `since` is gone: that row was committed
        when the caller read it, so only lost data can lack it."""
        with _unavailable_on_connection_error():
            row = await self._pool.fetchrow(
                "SELECT coalesce((SELECT epoch FROM lockservice.epochs WHERE prefix = $1), 0)"
                " AS epoch, (SELECT CASE WHEN is_called THEN last_value ELSE 0 END"
                " FROM lockservice.grant_history_id_seq) AS counter,"
                " (SELECT coalesce(max(id), 0) FROM lockservice.grant_history) AS anchor,"
                " ($2::bigint > 0 AND NOT EXISTS"
                "  (SELECT 1 FROM lockservice.grant_history WHERE id = $2::bigint)) AS lost",
                self._prefix,
                since,
            )
        return IssuancePosition(
            epoch=row["epoch"], counter=row["counter"], anchor=row["anchor"], lost=row["lost"]
        )

    async def highest_token_issued(self) -> int:
        """Over every key of every prefix (the fences do not say which prefix issued them)."""
        with _unavailable_on_connection_error():
            high: int = await self._pool.fetchval(
                "SELECT greatest("
                " (SELECT coalesce(max(last_token), 0) FROM lockservice.key_counters),"
                " (SELECT coalesce(max(token), 0) FROM lockservice.grant_history))"
            )
        return high

    async def history_retained_since(self) -> datetime | None:
        """The grant_history table is never pruned."""
        return None

    async def grant_history(
        self, key_prefix: str = "", *, limit: int | None = None
    ) -> list[GrantRecord]:
        """Every grant of this prefix, ordered by (key, token). A grant whose session expired
        while nobody touched its key has no stored end yet: it is reported ended at the
        session's expiry ('expired'), which is what the next acquire or close will store."""
        if limit is not None and limit < 0:
            raise InvalidRequest("limit must not be negative")
        with _unavailable_on_connection_error():
            rows = await self._pool.fetch(
                "SELECT g.key, g.token, g.session_id, g.acquired_at,"
                " coalesce(g.ended_at, CASE WHEN s.expires_at <= clock_timestamp()"
                "   THEN s.expires_at END) AS ended_at,"
                " coalesce(g.end_reason, CASE WHEN s.expires_at <= clock_timestamp()"
                "   THEN 'expired' END) AS end_reason"
                " FROM lockservice.grant_history g"
                " LEFT JOIN lockservice.sessions s"
                "   ON g.ended_at IS NULL AND s.session_id = g.session_id"
                " WHERE starts_with(g.key, $1) ORDER BY g.key, g.token LIMIT $2",
                self._full(key_prefix),
                limit,
            )
        cut = len(self._prefix)
        return [
            GrantRecord(
                key=r["key"][cut:],
                token=r["token"],
                session_id=str(r["session_id"]),
                acquired_at=r["acquired_at"],
                ended_at=r["ended_at"],
                end_reason=r["end_reason"],
            )
            for r in rows
        ]

    async def audit_records(self) -> list[dict[str, Any]]:
        """This prefix's audit rows, oldest first (operators and tests)."""
        with _unavailable_on_connection_error():
            rows = await self._pool.fetch(
                "SELECT at, action, key, operator, reason, detail FROM lockservice.audit"
                " WHERE prefix = $1 ORDER BY id",
                self._prefix,
            )
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]

    async def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await self._listener.close(timeout=2)
            self._listener = None
        await close_pool(self._pool)  # terminates what cannot close politely (a stopped server)
