"""Fixtures for the local-stack tests: private ports, a private run directory, and the database;
and what several of them check of a running stack: an acquire as the worker, its metrics
endpoints and the identifier labels none may carry, and every process gone after it.

Every port is passed by environment variable and chosen free, so a developer's own stack on
7233/8233/8701... never collides with the tests.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from common.pgutil import create_database, drop_database
from stack.config import Ports
from stack.embedded.shared import free_port
from stack.endpoints import endpoints
from stack.process import pid_alive
from stack.system import Stack


@pytest.fixture
def stack_env() -> dict[str, str]:
    """The environment of a test stack: every port free and set by its PAYOUTS_* variable (the
    worker bases 0: each worker its own free ports), so that no default port is ever bound."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    for key, var in Ports.ENV_VARS.items():
        # free_port never returns one it handed out before
        env[var] = "0" if key.startswith("worker_") else str(free_port())
    env.pop("ETCD_ENDPOINTS", None)  # the stack tests start their own etcd
    return env


@pytest.fixture
def stack_dir(run_dir: Path) -> Path:
    """A private, world-traversable run directory (the embedded PostgreSQL runs unprivileged)."""
    path = run_dir / f"stack-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    return path


@contextlib.asynccontextmanager
async def external_database(prefix: str = "payouts_stack") -> AsyncIterator[str | None]:
    """A fresh database on $DATABASE_URL's server when it is set (a stack given it must use it),
    dropped afterwards; else None (the stack starts its embedded PostgreSQL)."""
    server = os.environ.get("DATABASE_URL")
    if not server:
        yield None
        return
    url = await create_database(server, prefix=prefix)
    try:
        yield url
    finally:
        await drop_database(server, url)


@pytest.fixture
async def external_database_url() -> AsyncIterator[str | None]:
    """`external_database` for one test."""
    async with external_database() as url:
        yield url


def assert_all_gone(pids: dict[str, int]) -> None:
    alive = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    assert not alive, f"processes left behind: {alive}"


async def acquire_token(stack: Stack, key: str) -> int:
    """An acquire as the worker component (the stack's token for it)."""
    lock_url, headers = stack.lock_url, {"Authorization": f"Bearer {stack.token('worker')}"}
    async with httpx.AsyncClient(base_url=lock_url, timeout=10, headers=headers) as http:
        session = (await http.post("/v1/sessions", json={})).json()["session_id"]
        resp = await http.post("/v1/locks/acquire", json={"session_id": session, "key": key})
        resp.raise_for_status()
        return int(resp.json()["token"])


#: Label names that would carry an unbounded identifier (NFR-09).
ID_LABELS = {
    "payout_id", "account_id", "key", "lock_key", "token", "session", "session_id",
    "correlation_id", "client_reference", "workflow_id", "run_id", "movement_id",
}  # fmt: skip


def metrics_endpoints(stack: Stack) -> dict[str, str]:
    """Every /metrics the stack's processes serve (stack.endpoints, as `payouts up` prints
    them): ours, the Temporal SDK's per worker, and the dev server's."""
    return {e.process: f"{e.url}/metrics" for e in endpoints(stack) if e.job != "temporal"}
