"""What the chaos faults read of the rail proxy's attempt record, while PostgreSQL may be down.

Owns: the faults' one small pool (created on first use, closed at the run's end) and the two
questions the armed pause and the rail_slow window ask of `railproxy.attempts`: whether a newer
holder has submitted a payout, and how many submissions the proxy recorded since a point. Must
never: write anything, or fail a fault because PostgreSQL is restarting (a read that meets the
restart answers "nothing yet").
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from common.pgutil import create_pool
from stack.system import Stack

__all__ = ["ProxyAttempts"]

#: What a query from the injector may meet while PostgreSQL is being restarted by a fault.
_DB_UNAVAILABLE = (
    TimeoutError,
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # A restart can leave a pooled connection mid-protocol (as in railproxy.service).
    asyncpg.InternalClientError,
)


class ProxyAttempts:
    """The proxy's attempt record of `stack`, read through one small pool."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self._pool: asyncpg.Pool | None = None

    async def pool(self) -> asyncpg.Pool:
        """The faults' one small pool, created on first use."""
        if self._pool is None:
            self._pool = await create_pool(
                self.stack.database_url, min_size=0, max_size=2, timeout=5
            )
        return self._pool

    async def newer_attempt(self, payout_id: str, token: int) -> bool:
        """Whether the proxy has recorded a submission of the payout under a higher token."""
        # Armed pauses run beside the other faults: PostgreSQL may be restarting right now.
        try:
            top = await (await self.pool()).fetchval(
                "SELECT max(token) FROM railproxy.attempts WHERE payout_id = $1", payout_id
            )
        except _DB_UNAVAILABLE:
            return False
        return top is not None and int(top) > token

    async def last_attempt_id(self) -> int | None:
        """The proxy's newest attempt id (None: the database is unreachable right now)."""
        try:
            value = await (await self.pool()).fetchval(
                "SELECT coalesce(max(attempt_id), 0) FROM railproxy.attempts"
            )
        except _DB_UNAVAILABLE:
            return None
        return int(value)

    async def attempts_since(self, before: int | None) -> int:
        """Submissions the proxy recorded (and so forwarded, or tried to) after `before`."""
        now = await self.last_attempt_id()
        return 0 if now is None or before is None else now - before

    async def close(self) -> None:
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 5)
