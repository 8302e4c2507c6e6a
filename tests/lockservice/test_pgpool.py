"""The PostgreSQL lock backend's connections (lockservice.server.backends.pgpool: asyncpg's Pool, with
no reset query on release), on a real PostgreSQL: one caller per connection, never more than
`size` of them, and a connection goes back to the next caller in a clean state (no transaction
left open, no statement still running) or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from lockservice.server.backends.pgpool import close_pool, open_pool


@pytest.fixture
async def pool(lock_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    conns = await open_pool(lock_database_url, size=2, command_timeout=10)
    yield conns
    await close_pool(conns)


async def test_callers_never_share_a_connection_and_never_exceed_size(pool: asyncpg.Pool) -> None:
    in_use: set[int] = set()
    seen: set[int] = set()
    overlap: list[int] = []

    async def one() -> None:
        async with pool.acquire() as conn:
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
    await asyncio.gather(*(one() for _ in range(12)))
    assert overlap == []
    assert 1 <= len(seen) <= 2


async def test_an_sql_error_keeps_the_connection(lock_database_url: str) -> None:
    one = await open_pool(lock_database_url, size=1, command_timeout=10)
    try:
        first = await one.fetchval("SELECT pg_backend_pid()")
        with pytest.raises(asyncpg.DivisionByZeroError):
            await one.fetchval("SELECT 1 / 0")
        async with one.acquire() as conn, conn.transaction():
            assert await conn.fetchval("SELECT pg_backend_pid()") == first
    finally:
        await close_pool(one)


async def test_a_block_refusal_rolls_back(pool: asyncpg.Pool) -> None:
    with pytest.raises(ValueError, match="refused"):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT set_config('application_name', 'pgpool-probe', false)")
            raise ValueError("refused")
    # Rolled back: the session setting made inside the block is undone on every connection.
    async with pool.acquire() as a, pool.acquire() as b:
        for conn in (a, b):
            assert await conn.fetchval("SELECT current_setting('application_name')") != (
                "pgpool-probe"
            )
            assert not conn.is_in_transaction()


async def test_a_cancelled_call_leaves_its_connection_idle(lock_database_url: str) -> None:
    """With one connection, the next caller gets the cancelled call's (or a new one, had asyncpg
    terminated it): its statement was cancelled on the server (else `SELECT 1` would wait behind
    pg_sleep(30) and fail at the 10 s command timeout) and no transaction is left open."""
    one = await open_pool(lock_database_url, size=1, command_timeout=10)
    try:
        started = asyncio.Event()

        async def slow() -> None:
            async with one.acquire() as conn:
                started.set()
                await conn.execute("SELECT pg_sleep(30)")

        task = asyncio.create_task(slow())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with one.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1
            assert not conn.is_in_transaction()
    finally:
        await close_pool(one)


async def test_a_connection_the_server_dropped_is_replaced(
    pool: asyncpg.Pool, lock_database_url: str
) -> None:
    dropped = await pool.fetchval("SELECT pg_backend_pid()")
    admin = await asyncpg.connect(lock_database_url)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", dropped)
    finally:
        await admin.close()
    # The first call may still pick the dropped connection before its socket reports EOF: it
    # fails as a connection error (the backend maps these to BackendUnavailable) and that
    # connection is terminated, so the next call runs on a new one.
    try:
        pid = await pool.fetchval("SELECT pg_backend_pid()")
    except (asyncpg.InterfaceError, asyncpg.InternalClientError, asyncpg.PostgresError):
        pid = await pool.fetchval("SELECT pg_backend_pid()")
    assert pid != dropped


async def test_after_close_calls_fail(lock_database_url: str) -> None:
    conns = await open_pool(lock_database_url, size=2, command_timeout=10)
    await conns.fetchval("SELECT 1")
    await close_pool(conns)
    with pytest.raises(asyncpg.InterfaceError):
        await conns.fetchval("SELECT 1")
