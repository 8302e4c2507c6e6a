"""Fixtures for the local-stack tests: private ports, a private run directory, and the database.

Every port is passed by environment variable and chosen free, so a developer's own stack on
7233/8233/8701... never collides with the tests.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.pgutil import create_database, drop_database
from stack.config import Ports
from stack.embedded import free_port
from stack.process import pid_alive

PORT_KEYS = ("temporal", "temporal_ui", "lock", "railstub", "railproxy", "finledger", "etcd")


@pytest.fixture
def stack_env() -> dict[str, str]:
    """The environment of a test stack: every port free and set by its PAYOUTS_* variable."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    ports: set[int] = set()
    for key in PORT_KEYS:
        port = free_port()
        while port in ports:
            port = free_port()
        ports.add(port)
        env[Ports.ENV_VARS[key]] = str(port)
    env.pop("ETCD_ENDPOINTS", None)  # the stack tests start their own etcd
    return env


@pytest.fixture
def stack_dir(run_dir: Path) -> Path:
    """A private, world-traversable run directory (the embedded PostgreSQL runs unprivileged)."""
    path = run_dir / f"stack-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture
def external_database_url() -> Iterator[str | None]:
    """A fresh database on $DATABASE_URL's server when it is set (the stack must use it), else None."""
    server = os.environ.get("DATABASE_URL")
    if not server:
        yield None
        return
    url = asyncio.run(create_database(server, prefix="payouts_stack"))
    try:
        yield url
    finally:
        asyncio.run(drop_database(server, url))


def assert_all_gone(pids: dict[str, int]) -> None:
    alive = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    assert not alive, f"processes left behind: {alive}"
