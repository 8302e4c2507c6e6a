"""The embedded real servers start, answer and can be restarted under test control."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import asyncpg
import pytest

from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import (
    EmbeddedPostgres,
    others_can_traverse,
    pg_data_dir,
    world_reachable_copy,
)
from tests.jsonlogs import non_json_lines


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
    # Issue 28 §5: its log is JSON from the first line, over two starts and two stops.
    lines = server.log_path.read_text().splitlines()
    assert any('"database system is ready to accept connections"' in line for line in lines)
    assert non_json_lines([server.log_path]) == []


@pytest.mark.slow
def test_embedded_etcd_logs_json_from_the_first_line(tmp_path: Path) -> None:
    """Issue 28 §5: a member's log (`--log-outputs`) is JSON from the first line; the gRPC
    library's text goes to its stderr file, which is not the log."""
    cluster = EmbeddedEtcd(base_dir=tmp_path / "etcd")
    cluster.start()
    cluster.stop()
    [member] = cluster.members
    assert member.log_path.read_text().splitlines(), "etcd wrote nothing to its log"
    assert non_json_lines([member.log_path]) == []
    assert member.stderr_path.exists()


async def test_etcd_fixture_is_a_real_etcd(etcd_endpoints: list[str], key_prefix: str) -> None:
    """The session etcd answers a put and a get, and reports a revision."""
    from lockservice.server import etcd_client

    async with etcd_client(etcd_endpoints) as client:
        put = await client.put(f"{key_prefix}probe".encode(), b"1")
        got = await client.get(f"{key_prefix}probe".encode())
        assert got is not None and got.value == b"1"
        assert put.header.revision >= 1


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the unprivileged-user path is root's")


@needs_root
def test_binaries_in_a_private_directory_are_copied_where_others_can_reach_them(
    tmp_path: Path,
) -> None:
    """Under root, PostgreSQL runs as an unprivileged user: binaries under a 0700 directory (a
    clone under /root or in `mktemp -d`) are used from a complete, world-traversable copy that
    keeps the layout their relative rpath needs (bin/ beside ../../../pgserver.libs)."""
    private = tmp_path / "private"
    (private / "pgserver" / "pginstall" / "bin").mkdir(parents=True)
    (private / "pgserver" / "pginstall" / "bin" / "initdb").write_text("#!/bin/sh\n")
    (private / "pgserver.libs").mkdir()
    (private / "pgserver.libs" / "libpq.so").write_text("lib")
    private.chmod(0o700)
    label = f"test{uuid.uuid4().hex[:6]}"
    parts = ("pgserver/pginstall", "pgserver.libs")
    copy = world_reachable_copy(private, parts, label)
    try:
        assert copy != private
        assert (copy / "pgserver" / "pginstall" / "bin" / "initdb").read_text() == "#!/bin/sh\n"
        assert (copy / "pgserver.libs" / "libpq.so").read_text() == "lib"
        assert others_can_traverse(copy / "pgserver.libs")
        # A second start reuses the complete copy.
        assert world_reachable_copy(private, parts, label) == copy
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@needs_root
@pytest.mark.slow
async def test_a_cluster_under_a_private_directory_starts(tmp_path: Path) -> None:
    """A run directory the unprivileged user cannot traverse still gets a working cluster: its
    data goes to a folder under the temp directory named after the requested path."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    server = EmbeddedPostgres(data_dir=private / "run" / "pg")
    assert server.data_dir == pg_data_dir(private / "run" / "pg") != private / "run" / "pg"
    server.start()
    try:
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(server.data_dir.parent, ignore_errors=True)
