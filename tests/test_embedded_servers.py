"""The embedded real servers start, answer and can be restarted under test control."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from payouts.embedded import EmbeddedPostgres


async def test_database_fixture_is_a_real_postgres(database_url: str) -> None:
    """The session database is a real PostgreSQL server we can write to."""
    conn = await asyncpg.connect(database_url)
    try:
        version = await conn.fetchval("SHOW server_version_num")
        assert int(version) >= 140000
    finally:
        await conn.close()


@pytest.mark.slow
async def test_embedded_postgres_survives_a_restart(run_dir: Path) -> None:
    """Data committed before a stop is there after the next start (what restart tests rely on)."""
    server = EmbeddedPostgres(data_dir=run_dir / "pg-restart")
    server.start()
    try:
        conn = await asyncpg.connect(server.url)
        await conn.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (41)")
        await conn.close()
        server.stop()
        assert not server.is_running()
        server.start()
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT x FROM t") == 41
        await conn.close()
    finally:
        server.stop(mode="immediate")


async def test_etcd_fixture_is_a_real_etcd(etcd_endpoints: list[str], key_prefix: str) -> None:
    """The session etcd answers a put and a get, and reports a revision."""
    import aetcd

    host, port = etcd_endpoints[0].rsplit(":", 1)
    async with aetcd.Client(host=host, port=int(port)) as client:
        put = await client.put(f"{key_prefix}probe".encode(), b"1")
        got = await client.get(f"{key_prefix}probe".encode())
        assert got is not None and got.value == b"1"
        assert put.header.revision >= 1
