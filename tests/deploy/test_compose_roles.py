"""docker-compose.yml's database roles on a real PostgreSQL: deploy/compose/postgres-init.sh run
as the postgres image runs it, migrations as `migrator`, then each component's role does its
work and is refused outside its own schema (negative controls: the privilege boundaries hold)."""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from lockservice.backends.postgres import PostgresBackend
from payouts.embedded import EmbeddedPostgres, _pg_bin
from payouts.migrate import migrate
from tests.deploy.conftest import ROOT

PASSWORDS = {
    "MIGRATOR_DB_PASSWORD": "m-pw",
    "LOCK_DB_PASSWORD": "l-pw",
    "RAILPROXY_DB_PASSWORD": "r-pw",
    "WORKER_DB_PASSWORD": "w-pw",
    "OUTBOX_DB_PASSWORD": "o-pw",
    "READER_DB_PASSWORD": "rd-pw",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private server: the script creates cluster-wide roles, so never a shared one."""
    pg = EmbeddedPostgres(data_dir=tmp_path_factory.mktemp("roles") / "pg", fast=True)
    pg.start()
    try:
        url = urllib.parse.urlsplit(pg.url)
        env = {
            **os.environ,
            **PASSWORDS,
            "POSTGRES_USER": url.username or "postgres",
            "PGHOST": url.hostname or "127.0.0.1",
            "PGPORT": str(url.port),
            "PATH": f"{Path(_pg_bin('psql')).parent}:{os.environ['PATH']}",
        }
        script = ROOT / "deploy" / "compose" / "postgres-init.sh"
        subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True)
        yield f"{url.hostname}:{url.port}"
    finally:
        pg.stop(mode="immediate")


def dsn(server: str, role: str, password: str) -> str:
    return f"postgresql://{role}:{password}@{server}/payouts"


@pytest.fixture(scope="module")
async def migrated(server: str) -> AsyncIterator[str]:
    applied = await migrate(dsn(server, "migrator", "m-pw"))
    assert any(a.startswith("paydb/") for a in applied)
    yield server


async def test_lock_server_role_starts_its_backend_and_grants(migrated: str) -> None:
    backend = await PostgresBackend.start(dsn(migrated, "lock_server", "l-pw"))
    try:
        session = await backend.open_session(15.0)
        grant = await backend.acquire(session.session_id, "payout:acct-1", 1.0)
        assert getattr(grant, "token", 0) > 0
    finally:
        await backend.close()


async def _can(url: str, sql: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
        return True
    except asyncpg.InsufficientPrivilegeError:
        return False
    finally:
        await conn.close()


async def test_each_role_stays_in_its_schema(migrated: str) -> None:
    worker = dsn(migrated, "worker", "w-pw")
    reader = dsn(migrated, "reader", "rd-pw")
    proxy = dsn(migrated, "railproxy", "r-pw")
    assert await _can(worker, "SELECT count(*) FROM paydb.payouts")
    assert await _can(proxy, "SELECT count(*) FROM railproxy.attempts")
    assert await _can(reader, "SELECT count(*) FROM lockservice.key_counters")
    # Negative controls: outside its own schema, or writing as the reader, is refused.
    assert not await _can(worker, "SELECT count(*) FROM lockservice.key_counters")
    assert not await _can(worker, "SELECT count(*) FROM railproxy.attempts")
    assert not await _can(proxy, "SELECT count(*) FROM paydb.payouts")
    assert not await _can(reader, "DELETE FROM paydb.payouts")
