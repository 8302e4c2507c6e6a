"""PostgreSQL backend only: finding a key held is cheap (003_cheap_waiters.sql). The 'held' answer
takes no row lock and writes nothing, so blocked acquirers never queue behind the key's counter
row lock, and each of them costs the database a plain read per attempt, not a write transaction.

Each check runs while another transaction holds the key's counter row FOR UPDATE, so any attempt
to lock that row would block; the negative controls run the same checks against the 002 version
of `acquire_grant` and see it block (lock_timeout) and take a transaction id.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources

import asyncpg
import pytest

from lockservice.api import TOKEN_EPOCH_STRIDE, Grant, NotAcquired, SessionNotFound
from lockservice.server.backends.postgres import PostgresBackend

#: Fails an attempt that waits for a row lock at all (the locker below never lets go in time).
_LOCK_TIMEOUT = "500ms"


@pytest.fixture
async def pg(lock_database_url: str, key_prefix: str) -> AsyncIterator[PostgresBackend]:
    backend = await PostgresBackend.start(lock_database_url, prefix=key_prefix)
    yield backend
    await backend.close()


@asynccontextmanager
async def _counter_row_locked(database_url: str, full_key: str) -> AsyncIterator[None]:
    """Another transaction holds the key's counter row FOR UPDATE meanwhile."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            locked = await conn.fetchval(
                "SELECT key FROM lockservice.key_counters WHERE key = $1 FOR UPDATE", full_key
            )
            assert locked == full_key, "no counter row: the check below would prove nothing"
            yield
    finally:
        await conn.close()


@asynccontextmanager
async def _probe(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection on which any wait for a row lock fails, with the 002 function beside 003's."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f"SET lock_timeout = '{_LOCK_TIMEOUT}'")
        await conn.execute(_function_002_as("pg_temp.acquire_grant_002"))
        yield conn
    finally:
        await conn.close()


def _function_002_as(name: str) -> str:
    """The acquire_grant of migration 002, unchanged but for its name (a session-private copy:
    pg_temp lives and dies with the probe's connection)."""
    sql = (
        resources.files("lockservice.server") / "migrations" / "002_grant_functions.sql"
    ).read_text()
    found = re.search(r"CREATE FUNCTION acquire_grant\(.*?\n\$\$;", sql, re.DOTALL)
    assert found is not None, "acquire_grant not found in 002_grant_functions.sql"
    return found.group(0).replace("CREATE FUNCTION acquire_grant(", f"CREATE FUNCTION {name}(", 1)


async def _attempt(
    conn: asyncpg.Connection, function: str, prefix: str, full_key: str, sid: str
) -> tuple[asyncpg.Record, int | None]:
    """One acquire_grant call in its own transaction, and the transaction id it was assigned:
    PostgreSQL assigns one on the first write, and a row lock (FOR SHARE/UPDATE) is a write."""
    async with conn.transaction():
        row = await conn.fetchrow(
            f"SELECT * FROM {function}($1, $2, $3, $4)",
            prefix,
            full_key,
            uuid.UUID(sid),
            TOKEN_EPOCH_STRIDE,
        )
        xid = await conn.fetchval("SELECT pg_current_xact_id_if_assigned()::text::bigint")
    return row, xid


async def test_held_answer_waits_for_no_row_lock(
    pg: PostgresBackend, database_url: str, key_prefix: str
) -> None:
    """With the key's counter row locked by another transaction, acquire on the held key answers
    'held' at once, and a blocked acquire times out on its own budget, never stuck on the row."""
    a = await pg.open_session(30)
    b = await pg.open_session(30)
    await pg.acquire(a.session_id, "k", 0)
    async with _counter_row_locked(database_url, key_prefix + "k"):
        # The bound only detects a hang: with the 002 function this call waits on the row lock
        # for as long as the other transaction holds it (see the SQL-level control below).
        got = await asyncio.wait_for(pg.acquire(b.session_id, "k", 0), 5)
        assert got == NotAcquired("k", "held")
        blocked = await asyncio.wait_for(pg.acquire(b.session_id, "k", 0.3), 5)
        assert blocked == NotAcquired("k", "timeout")
    g = await pg.acquire(a.session_id, "free", 0)  # the granting path still works
    assert isinstance(g, Grant)


async def test_held_answer_locks_and_writes_nothing_unlike_002(
    pg: PostgresBackend, database_url: str, key_prefix: str
) -> None:
    """acquire_grant (003) on a held key returns 'held' with the holder's remaining lease, takes no
    row lock and gets no transaction id; the 002 function, in the same situation, blocks on the
    counter row lock, and without the locker it takes a transaction id (negative controls)."""
    holder = await pg.open_session(30)
    waiter = await pg.open_session(30)
    full = key_prefix + "k"
    await pg.acquire(holder.session_id, "k", 0)
    async with _probe(database_url) as probe:
        async with _counter_row_locked(database_url, full):
            row, xid = await _attempt(
                probe, "lockservice.acquire_grant", key_prefix, full, waiter.session_id
            )
            assert row["status"] == "held" and xid is None
            assert 0 < row["holder_expires_in"] <= 30
            with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
                await _attempt(
                    probe, "pg_temp.acquire_grant_002", key_prefix, full, waiter.session_id
                )
        row, xid = await _attempt(
            probe, "pg_temp.acquire_grant_002", key_prefix, full, waiter.session_id
        )
        assert row["status"] == "held" and xid is not None


async def test_a_grant_racing_the_precheck_is_caught_under_the_row_lock(
    pg: PostgresBackend, database_url: str, key_prefix: str
) -> None:
    """An acquirer whose lock-free read finds the key free while another acquirer's grant is not
    yet committed waits for the counter row lock, re-reads the holder, and answers 'held' with
    that holder's remaining lease, never a second grant."""
    first = await pg.open_session(30)
    second = await pg.open_session(30)
    full = key_prefix + "k"
    granting = await asyncpg.connect(database_url)
    racing = await asyncpg.connect(database_url)
    try:
        tx = granting.transaction()
        await tx.start()
        row = await granting.fetchrow(
            "SELECT * FROM lockservice.acquire_grant($1, $2, $3, $4)",
            key_prefix,
            full,
            uuid.UUID(first.session_id),
            TOKEN_EPOCH_STRIDE,
        )
        assert row["status"] == "granted"  # uncommitted: invisible to the other's pre-check
        call = asyncio.create_task(
            racing.fetchrow(
                "SELECT * FROM lockservice.acquire_grant($1, $2, $3, $4)",
                key_prefix,
                full,
                uuid.UUID(second.session_id),
                TOKEN_EPOCH_STRIDE,
            )
        )
        await _until_waiting_for_a_lock(granting, racing.get_server_pid(), call)
        await tx.commit()
        raced = await asyncio.wait_for(call, 5)
        assert raced["status"] == "held" and raced["token"] is None
        assert 0 < raced["holder_expires_in"] <= 30
    finally:
        await granting.close()
        await racing.close()
    info = await pg.inspect("k")
    assert (info.holder_session, info.token) == (first.session_id, row["token"])


async def _until_waiting_for_a_lock(
    conn: asyncpg.Connection, pid: int, call: asyncio.Task[asyncpg.Record]
) -> None:
    for _ in range(500):
        waiting = await conn.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
        if waiting:
            return
        assert not call.done(), f"did not wait for the row lock: {call.result()}"
        await asyncio.sleep(0.01)
    raise AssertionError("the racing acquirer never waited for the counter row lock")


async def test_dead_caller_gets_no_session_even_on_a_held_key(
    pg: PostgresBackend, database_url: str, key_prefix: str
) -> None:
    """The lock-free path checks the caller's own session first, as the locked path always did:
    a closed session gets SessionNotFound, not 'held', and the check writes nothing."""
    holder = await pg.open_session(30)
    gone = await pg.open_session(30)
    await pg.acquire(holder.session_id, "k", 0)
    await pg.close_session(gone.session_id)
    with pytest.raises(SessionNotFound):
        await pg.acquire(gone.session_id, "k", 0)
    async with _probe(database_url) as probe:
        row, xid = await _attempt(
            probe, "lockservice.acquire_grant", key_prefix, key_prefix + "k", gone.session_id
        )
    assert row["status"] == "no_session" and xid is None
