"""Fixtures and helpers of the lock-server, SDK and CLI tests (import them in the test modules).

`live_server` runs the real app under uvicorn on a free loopback port inside the test's event
loop, over a REAL backend (PostgreSQL or etcd, parametrized). `FakeClock` is a controllable
monotonic clock with a matching `sleep`, for the SDK's timing logic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from lockservice.api import LockBackend
from lockservice.server import create_app
from stack.embedded.shared import free_port
from tests.lockservice.fake_backend import FakeBackend


class FakeClock:
    """A monotonic clock that moves only when the test calls `advance`; `sleep` waits on it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + max(seconds, 0.0), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper in due order and letting it run."""
        target = self.now + seconds
        await settle()  # tasks created just before must reach their first sleep
        while True:
            due = [s for s in self._sleepers if s[0] <= target and not s[1].done()]
            self._sleepers = [s for s in self._sleepers if not s[1].done()]
            if not due:
                break
            wake_at, fut = min(due, key=lambda s: s[0])
            self.now = max(self.now, wake_at)
            fut.set_result(None)
            await settle()
        self.now = target
        await settle()


async def settle(rounds: int = 300) -> None:
    """Let in-memory tasks (ASGITransport requests, SDK loops) run to their next real wait."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def eventually(pred: Callable[[], bool], rounds: int = 2000) -> None:
    for _ in range(rounds):
        if pred():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


@contextlib.asynccontextmanager
async def serve_app(app: FastAPI, tls: Mapping[str, Any] | None = None) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a free loopback port in this event loop; yields its URL
    (https with `tls`: uvicorn's ssl_certfile/ssl_keyfile, common.tls.uvicorn_ssl)."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        **dict(tls or {}),
    )
    server = uvicorn.Server(config)
    # uvicorn would take over SIGINT/SIGTERM of the whole pytest process; the test owns signals.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture(params=["postgres", "etcd"])
async def real_backend(
    request: pytest.FixtureRequest,
    lock_database_url: str,
    etcd_endpoints: list[str],
    key_prefix: str,
) -> AsyncIterator[LockBackend]:
    """A connected real backend of each kind (A's `create_backend`), closed after the test."""
    from lockservice.server import create_backend

    kind: Any = request.param
    backend = await create_backend(
        kind, database_url=lock_database_url, etcd_endpoints=etcd_endpoints, prefix=key_prefix
    )
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
async def live_server(real_backend: LockBackend) -> AsyncIterator[str]:
    """URL of a real lock server (uvicorn + FastAPI) over a real backend."""
    async with serve_app(create_app(real_backend)) as url:
        yield url
