"""The PostgreSQL lock backend's connections: a small pool without per-call overhead.

asyncpg's Pool spends about 0.1 ms of CPU per query beyond the query itself (a shielded task
per release, a timeout scope and the reset hook), measured with uvloop on this project's
machine: two of them per acquire + release, a sixth of the lock server's time above its floor
(docs/performance.md). Here a call takes an idle connection from a list and puts it back.

Owns: opening at most `size` connections, handing each to one caller at a time, and returning
it only after a call that ended with an answer from the server (a result, or an SQL error that
PostgreSQL rolled back). Any other ending (cancellation, a command timeout, a connection error)
terminates the connection, so a connection in an unknown state is never reused.
Must never: hand one connection to two callers, keep session state between calls (callers run
single statements or `transaction()` blocks; LISTEN uses its own connection), or wait for a
connection without bound when the database is down (connect has a timeout).

`LibraryPool` is the alternative this module is measured against (asyncpg's own Pool behind the
same five calls), chosen only by the A/B of `make bench-locks` (LOCK_PG_POOL=asyncpg).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

import asyncpg

T = TypeVar("T")
#: Which pool the backend runs on: this module's (the default) or asyncpg's (the A/B's other side).
PoolKind = Literal["pgconns", "asyncpg"]
#: How long close() waits for one idle connection to close politely.
_CLOSE_S = 5.0


#: Server-sent errors after which the connection is closing or unusable.
_CONNECTION_LOST: tuple[type[asyncpg.PostgresError], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash shutdown
    asyncpg.exceptions.InsufficientResourcesError,
)


def _answered(exc: asyncpg.PostgresError) -> bool:
    """The server answered with an SQL error and rolled the statement back (the connection is
    as good as before), rather than reporting the connection lost."""
    return not isinstance(exc, _CONNECTION_LOST)


class PgConnections:
    """At most `size` connections to `url`, each used by one caller at a time."""

    def __init__(
        self, url: str, *, size: int, connect_timeout: float, command_timeout: float
    ) -> None:
        self._url = url
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._idle: list[asyncpg.Connection] = []
        self._slots = size  # connections that may still be opened
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @classmethod
    async def open(
        cls, url: str, *, size: int, connect_timeout: float = 10, command_timeout: float = 10
    ) -> PgConnections:
        """Opens one connection at once: a database that cannot be reached fails start-up."""
        conns = cls(
            url, size=size, connect_timeout=connect_timeout, command_timeout=command_timeout
        )
        conns._checkin(await conns._checkout(), reusable=True)
        return conns

    async def _connect(self) -> asyncpg.Connection:
        conn: asyncpg.Connection = await asyncpg.connect(
            self._url, timeout=self._connect_timeout, command_timeout=self._command_timeout
        )
        return conn

    async def _checkout(self) -> asyncpg.Connection:
        while True:
            if self._closed:
                raise asyncpg.InterfaceError("lock backend connections are closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():  # e.g. the server restarted while it sat idle
                    return conn
                self._slots += 1
            if self._slots > 0:
                self._slots -= 1
                try:
                    return await self._connect()
                except BaseException:
                    self._slots += 1
                    self._wake_one()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: pass the turn on
                else:
                    with contextlib.suppress(ValueError):
                        self._waiting.remove(waiter)
                raise

    def _checkin(self, conn: asyncpg.Connection, *, reusable: bool) -> None:
        if reusable and not self._closed and not conn.is_closed():
            self._idle.append(conn)
        else:
            conn.terminate()
            self._slots += 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def run(self, call: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`call` on a connection of its own; see the module doc for what is reused."""
        conn = await self._checkout()
        reusable = False
        try:
            result = await call(conn)
            reusable = True
            return result
        except asyncpg.PostgresError as exc:
            reusable = _answered(exc) and not conn.is_in_transaction()
            raise
        finally:
            self._checkin(conn, reusable=reusable)

    async def fetchrow(self, query: str, *args: Any) -> Any:  # a Record, or None
        return await self.run(lambda c: c.fetchrow(query, *args))

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self.run(lambda c: c.fetchval(query, *args))

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self.run(lambda c: c.fetch(query, *args))

    async def execute(self, query: str, *args: Any) -> str:
        return await self.run(lambda c: c.execute(query, *args))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """One connection inside one transaction for the block (committed at its end, rolled
        back if it raises)."""
        conn = await self._checkout()
        reusable = False
        try:
            async with conn.transaction():
                yield conn
            reusable = True
        except (asyncio.CancelledError, TimeoutError, OSError, asyncpg.InterfaceError):
            raise  # perhaps mid-statement or mid-rollback: never reused
        except asyncpg.PostgresError as exc:
            reusable = _answered(exc) and not conn.is_in_transaction()
            raise
        except Exception:
            # The block's own refusal (e.g. a bounded epoch step), raised between statements:
            # the transaction was rolled back on this connection, which is as good as before.
            reusable = not conn.is_in_transaction()
            raise
        finally:
            self._checkin(conn, reusable=reusable)

    async def close(self) -> None:
        """Closes the idle connections politely (within _CLOSE_S each, else terminates them);
        one still in use is terminated when its caller gives it back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_result(None)  # they find the connections closed
        self._waiting.clear()
        for conn in idle:
            try:
                await asyncio.wait_for(conn.close(), _CLOSE_S)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                conn.terminate()


class LibraryPool:
    """asyncpg's Pool behind PgConnections' calls: the other side of the A/B in
    lab.bench_locks. Configured as a replacement would be: the same size, timeouts and connect
    at start-up; no reset query on release (callers keep no session state, as above; asyncpg
    still rolls back a transaction left open and discards a connection in doubt)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def open(
        cls, url: str, *, size: int, connect_timeout: float = 10, command_timeout: float = 10
    ) -> LibraryPool:
        pool = await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=size,
            timeout=connect_timeout,
            command_timeout=command_timeout,
            reset=_no_reset,
        )
        return cls(pool)

    async def fetchrow(self, query: str, *args: Any) -> Any:  # a Record, or None
        return await self._pool.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._pool.fetchval(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self._pool.fetch(query, *args)
        return rows

    async def execute(self, query: str, *args: Any) -> str:
        status: str = await self._pool.execute(query, *args)
        return status

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._pool.acquire() as conn, conn.transaction():
            yield conn

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._pool.close(), _CLOSE_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._pool.terminate()


async def _no_reset(conn: asyncpg.Connection) -> None:
    """No reset query: nothing a caller does outlives its call (module doc)."""


async def open_pool(
    kind: PoolKind, url: str, *, size: int, command_timeout: float
) -> PgConnections | LibraryPool:
    """The backend's connections: this module's pool, or asyncpg's for the A/B."""
    if kind == "asyncpg":
        return await LibraryPool.open(url, size=size, command_timeout=command_timeout)
    return await PgConnections.open(url, size=size, command_timeout=command_timeout)
