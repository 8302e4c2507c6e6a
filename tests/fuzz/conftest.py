"""Fixtures of the fuzz runs: the whole system (lock server, rail stub, rail proxy as real
processes on one fresh database with every schema migrated), the finance ledger stand-in, a
lone rail stub, and the per-service header hook."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from finledger import create_app as create_finledger
from payouts.migrate import migrate
from payouts.pgutil import create_database, drop_database
from railstub import StubSettings
from railstub import create_app as create_stub
from tests.fuzz.harness import HeadersFor
from tests.servers import ServerThread
from tests.workflows.system import System, running_system


@pytest.fixture(scope="module")
def fuzz_headers() -> HeadersFor:
    """The one hook for request headers per service ("lock", "proxy", "stub", "finledger").

    Empty today. When the services require bearer tokens, return each service's credential
    here and every fuzz run sends it."""

    def headers(service: str) -> Mapping[str, str]:
        return {}

    return headers


def fresh_database(pg_server_url: str, prefix: str) -> Iterator[str]:
    url = asyncio.run(create_database(pg_server_url, prefix=prefix))
    asyncio.run(migrate(url))  # every schema: the invariant checker reads them all
    try:
        yield url
    finally:
        asyncio.run(drop_database(pg_server_url, url))


@pytest.fixture(scope="module")
def fuzz_db(pg_server_url: str) -> Iterator[str]:
    yield from fresh_database(pg_server_url, "fuzz")


@pytest.fixture(scope="module")
def fuzz_system(fuzz_db: str, run_dir: Path) -> Iterator[System]:
    """The real system, as the workflow tests start it, with grant verification on."""
    with running_system(fuzz_db, run_dir / "fuzz-system") as system:
        yield system


@pytest.fixture(scope="module")
def finledger_server() -> Iterator[ServerThread]:
    server = ServerThread(create_finledger())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lone_stub() -> Iterator[ServerThread]:
    """A rail stub of its own (see harness.EXCLUSIONS): no stalls, no ambiguity."""
    settings = StubSettings(
        seed=11, latency_mode="fixed", latency_fixed_ms=1, ambiguity_rate=0.0, stall_s=1.0
    )
    server = ServerThread(create_stub(settings))
    server.start()
    yield server
    server.stop()
