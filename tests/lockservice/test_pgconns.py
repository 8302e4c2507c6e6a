"""The PostgreSQL lock backend's own connection pool (lockservice.backends.pgconns), on a real
PostgreSQL: one caller per connection, never more than `size` of them, and a connection whose
call did not end with the server's answer is never handed out again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from lockservice.backends.pgconns import PgConnections


@pytest.fixture
async def conns(lock_database_url: str) -> AsyncIterator[PgConnections]:
    pool = await PgConnections.open(lock_database_url, size=2, command_timeout=10)
    yield pool
    await pool.close()


async def test_callers_never_share_a_connection_and_never_exceed_size(
    conns: PgConnections,
) -> None:
    in_use: set[int] = set()
    seen: set[int] = set()
    overlap: list[int] = []

    async def one(conn: asyncpg.Connection) -> None:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        if pid in in_use:
            overlap.append(pid)
        in_use.add(pid)
        seen.add(pid)
        try:
            await conn.execute("SELECT pg_sleep(0.02)")  # keeps it checked out meanwhile
        finally:
            in_use.discard(pid)

    # asyncpg itself refuses a second concurrent operation on one connection, so a shared
    # connection would also surface as InterfaceError here.
    await asyncio.gather(*(conns.run(one) for _ in range(12)))
    assert overlap == []
    assert 1 <= len(seen) <= 2


async def test_an_sql_error_keeps_the_connection(conns: PgConnections) -> None:
    first = await conns.fetchval("SELECT pg_backend_pid()")
    with pytest.raises(asyncpg.DivisionByZeroError):
        await conns.fetchval("SELECT 1 / 0")
    async with conns.transaction() as conn:
        assert await conn.fetchval("SELECT pg_backend_pid()") == first


async def test_a_block_refusal_rolls_back_and_keeps_the_connection(conns: PgConnections) -> None:
    first = await conns.fetchval("SELECT pg_backend_pid()")
    with pytest.raises(ValueError, match="refused"):
        async with conns.transaction() as conn:
            await conn.execute("SELECT set_config('application_name', 'pgconns-probe', false)")
            raise ValueError("refused")
    # Rolled back: the session setting made inside the block is undone on that connection.
    assert await conns.fetchval("SELECT current_setting('application_name')") != "pgconns-probe"
    assert await conns.fetchval("SELECT pg_backend_pid()") == first


async def test_a_cancelled_call_never_hands_its_connection_out_again(
    conns: PgConnections,
) -> None:
    started = asyncio.Event()
    pids: list[int] = []

    async def slow(conn: asyncpg.Connection) -> None:
        pids.append(await conn.fetchval("SELECT pg_backend_pid()"))
        started.set()
        await conn.execute("SELECT pg_sleep(30)")

    task = asyncio.create_task(conns.run(slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = {await conns.fetchval("SELECT pg_backend_pid()") for _ in range(4)}
    assert pids[0] not in after


async def test_a_connection_the_server_dropped_is_replaced(
    conns: PgConnections, lock_database_url: str
) -> None:
    dropped = await conns.fetchval("SELECT pg_backend_pid()")
    admin = await asyncpg.connect(lock_database_url)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", dropped)
    finally:
        await admin.close()
    # The first call may still pick the dropped connection before its socket reports EOF: it
    # fails as a connection error (the backend maps these to BackendUnavailable) and that
    # connection is terminated, so the next call runs on a new one.
    try:
        pid = await conns.fetchval("SELECT pg_backend_pid()")
    except (asyncpg.InterfaceError, asyncpg.InternalClientError, asyncpg.PostgresError):
        pid = await conns.fetchval("SELECT pg_backend_pid()")
    assert pid != dropped


async def test_after_close_calls_fail(lock_database_url: str) -> None:
    pool = await PgConnections.open(lock_database_url, size=2, command_timeout=10)
    await pool.fetchval("SELECT 1")
    await pool.close()
    with pytest.raises(asyncpg.InterfaceError):
        await pool.fetchval("SELECT 1")
