"""The PostgreSQL lock backend's connections: asyncpg's Pool, configured for the backend.

Why the library: the backend ran on a hand-written pool (`pgconns`, issue 16) to save asyncpg's
per-call overhead. The A/B of issue 30 (`make bench-locks` at commit c09c270, docs/performance.md
"Issue 30: the A/B of the SDK transport and the backend pool") measured, in the same runs,
interleaved, the lock server's CPU per acquire + release at 1.66 ms (pgconns) against 1.88 ms
(this pool), and 2.01 ms against 2.27 ms: 0.22-0.25 ms less, while the ten rounds of each side
spread over 1.3-1.6 ms (loadavg 2.8-6.6). Not clearly better beyond the spread, so the library.

Owns: the pool's size, timeouts and what happens on release. Must never: keep session state
between calls (callers run single statements or `transaction()` blocks; LISTEN uses its own
connection), which is why no reset query runs on release (asyncpg still rolls back a transaction
left open, waits out a cancelled statement's cancellation, and terminates a connection whose
release failed); nor wait for a connection without bound when the database is down (connect has
a timeout, and start-up opens one connection, so an unreachable database fails it).
"""

from __future__ import annotations

import asyncio

import asyncpg

#: How long close() waits for the connections to close politely before terminating them.
_CLOSE_S = 5.0


async def open_pool(
    url: str, *, size: int, connect_timeout: float = 10, command_timeout: float = 10
) -> asyncpg.Pool:
    """At most `size` connections to `url`, one opened at once."""
    pool: asyncpg.Pool = await asyncpg.create_pool(
        url,
        min_size=1,
        max_size=size,
        timeout=connect_timeout,
        command_timeout=command_timeout,
        reset=_no_reset,
    )
    return pool


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Nothing a caller does outlives its call (module doc): the default reset query
    (UNLISTEN, RESET ALL, ...) would be one more round trip per call for nothing."""


async def close_pool(pool: asyncpg.Pool) -> None:
    """Closes the connections politely within _CLOSE_S, else terminates them (a stopped server,
    or a caller that still holds one)."""
    try:
        await asyncio.wait_for(pool.close(), _CLOSE_S)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        pool.terminate()
