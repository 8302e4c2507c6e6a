"""Fixtures of the lock-backend contract suite: one real backend per test, over both kinds.

`backend` is parametrized over ["postgres", "etcd"] and uses the session servers (which may be
external) with a unique key prefix. Tests that stop or restore a server use `private_postgres` /
`private_etcd`, which start their own embedded server under `run_dir` and never touch the
session servers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from lockservice.api import BackendUnavailable, LockBackend
from lockservice.server import create_backend
from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import EmbeddedPostgres

BackendFactory = Callable[[], Awaitable[LockBackend]]
T = TypeVar("T")


@pytest.fixture(params=["postgres", "etcd"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def backend_address(request: pytest.FixtureRequest, backend_kind: str) -> str | list[str]:
    """Only the server this test's kind needs (resolved outside the event loop on purpose)."""
    if backend_kind == "postgres":
        return str(request.getfixturevalue("lock_database_url"))  # the lock server's role
    return list(request.getfixturevalue("etcd_endpoints"))


@pytest.fixture
async def backend_factory(
    backend_kind: str, backend_address: str | list[str], key_prefix: str
) -> AsyncIterator[BackendFactory]:
    """Creates backends of this test's kind on one shared prefix (a 'restart' is a new one)."""
    created: list[LockBackend] = []

    async def make() -> LockBackend:
        if isinstance(backend_address, str):
            b = await create_backend("postgres", database_url=backend_address, prefix=key_prefix)
        else:
            b = await create_backend("etcd", etcd_endpoints=backend_address, prefix=key_prefix)
        created.append(b)
        return b

    yield make
    for b in created:
        await b.close()


@pytest.fixture
async def backend(backend_factory: BackendFactory) -> LockBackend:
    """A fresh backend with a unique prefix, closed after the test."""
    return await backend_factory()


@pytest.fixture
def private_postgres(run_dir: Path) -> Iterator[EmbeddedPostgres]:
    """A private PostgreSQL server that the test may stop and start."""
    server = EmbeddedPostgres(data_dir=run_dir / f"pg-{uuid.uuid4().hex[:8]}", fast=True)
    server.start()
    try:
        yield server
    finally:
        server.stop(mode="immediate")


@pytest.fixture
def private_etcd(run_dir: Path) -> Iterator[EmbeddedEtcd]:
    """A private one-member etcd that the test may stop, start and restore."""
    cluster = EmbeddedEtcd(base_dir=run_dir / f"etcd-{uuid.uuid4().hex[:8]}", size=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def until_available(call: Callable[[], Awaitable[T]], *, attempts: int = 100) -> T:
    """Retry a call while the backend reports BackendUnavailable (e.g. just after a restart)."""
    for _ in range(attempts - 1):
        try:
            return await call()
        except BackendUnavailable:
            await asyncio.sleep(0.1)
    return await call()
