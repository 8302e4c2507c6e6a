"""The PostgreSQL lock backend's operator actions (FR-07, FR-08), the restore procedure's epoch
bump and issuance position (INV-04), and the grant history and audit rows read back.

Owns: inspect, force-revoke and bump-epoch, each one transaction with its audit row, and the
reads of `lockservice.grant_history` and `lockservice.audit` for its key prefix. Must never:
lower a key's counter or the epoch (the next token is higher by construction), or end a grant's
history row later than its session's expiry.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg

from lockservice.api import (
    GrantRecord,
    InvalidRequest,
    IssuancePosition,
    LockInfo,
    RevokeResult,
    next_epoch,
    validate_key,
    validate_operator,
)
from lockservice.server.backends import events
from lockservice.server.backends.postgres_common import (
    BACKEND,
    CHANNEL,
    end_history,
    unavailable_on_connection_error,
)


class PostgresOperators:
    """Operator actions and history reads on one key prefix."""

    def __init__(self, pool: asyncpg.Pool, prefix: str, replica_id: str | None) -> None:
        self._pool = pool
        self._prefix = prefix
        #: The lock-server replica named in every audit row (None: written by no lock server,
        #: e.g. the offline `bump-epoch`).
        self._replica_id = replica_id

    async def inspect(self, key: str) -> LockInfo:
        validate_key(key)
        full = self._prefix + key
        with unavailable_on_connection_error():
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
        full = self._prefix + key
        with unavailable_on_connection_error():
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
                    await end_history(conn, full, holder["token"], "revoked", holder["expires_at"])
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
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, full)
        events.revoked(BACKEND, key, revoked, operator, reason, replica=self._replica_id)
        return RevokeResult(key=key, revoked_token=revoked, operator=operator, reason=reason, at=at)

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        operator, reason = validate_operator(operator, reason)
        with unavailable_on_connection_error():
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
                new = next_epoch(old, min_epoch, highest_fence_seen)
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
                    await end_history(
                        conn, row["key"], row["token"], "epoch_bumped", row["expires_at"]
                    )
                    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, row["key"])
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
            BACKEND,
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
        with unavailable_on_connection_error():
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
        with unavailable_on_connection_error():
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
        with unavailable_on_connection_error():
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
                self._prefix + key_prefix,
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
        with unavailable_on_connection_error():
            rows = await self._pool.fetch(
                "SELECT at, action, key, operator, reason, detail FROM lockservice.audit"
                " WHERE prefix = $1 ORDER BY id",
                self._prefix,
            )
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]
