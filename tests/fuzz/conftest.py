"""Fixtures of the fuzz runs: the whole system (lock server, rail stub, rail proxy as real
processes on one fresh database with every schema migrated), the finance ledger stand-in, a
lone rail stub, and the per-service header hook."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from common.migrate import migrate
from common.pgutil import create_database, drop_database
from finledger import create_app as create_finledger
from finledger.settings import FinledgerSettings
from railstub import StubSettings
from railstub import create_app as create_stub
from tests.credentials import OPERATOR, credentials, headers
from tests.fuzz.harness import CaseHeaders, HeadersFor
from tests.servers import ServerThread
from tests.workflows.system import System, running_system

#: The lock server's break-glass routes: an operator's credential; every other route: the
#: worker's (the identity that holds grants and may inspect).
_OPERATOR_PATHS = ("/v1/locks/revoke", "/v1/epoch/bump")
#: Which identity each service is fuzzed as (the caller it serves in production).
_CALLER = {"proxy": "worker", "stub": "railproxy", "finledger": "outbox"}


@pytest.fixture(scope="module")
def fuzz_headers() -> HeadersFor:
    """The one hook for request headers per service ("lock", "proxy", "stub", "finledger"):
    each run sends the credential of the caller the route serves, so the fuzz reaches the
    handlers instead of stopping at 401 (the auth tests of each component cover those)."""

    def for_service(service: str) -> CaseHeaders:
        def for_path(path: str) -> Mapping[str, str]:
            if service == "lock":
                return headers(OPERATOR if path in _OPERATOR_PATHS else "worker")
            return headers(_CALLER[service])

        return for_path

    return for_service


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
    settings = FinledgerSettings(credentials_path=str(credentials().servers["finledger"]))
    server = ServerThread(create_finledger(settings))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lone_stub() -> Iterator[ServerThread]:
    """A rail stub of its own (see harness.EXCLUSIONS): no stalls, no ambiguity."""
    settings = StubSettings(
        seed=11,
        latency_mode="fixed",
        latency_fixed_ms=1,
        ambiguity_rate=0.0,
        stall_s=1.0,
        credentials_path=credentials().servers["railstub"],
    )
    server = ServerThread(create_stub(settings))
    server.start()
    yield server
    server.stop()
