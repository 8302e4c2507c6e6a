"""Fixtures of the workflow tests that run the real system: per test module, the lock server,
rail stub and rail proxy as real processes on the session database (tests/workflows/system.py),
and per test, in-process workers on a task queue of their own, and a rail whose lookups lag.

A module using them sets RULES (its rail stub's behaviour rules) and may set WORKERS (how many
workers `workers` starts; 1 unless set)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from common.migrate import migrate
from tests.stack.conftest import external_database_url
from tests.workflows.system import System, in_process_workers, running_system

__all__ = ["external_database_url"]  # the stack tests' fixture, for test_takeover's real stack


@pytest.fixture(scope="module")
def system(request: pytest.FixtureRequest, database_url: str, run_dir: Path) -> Iterator[System]:
    """The real system, every schema migrated, its rail stub given the module's RULES."""
    asyncio.run(migrate(database_url))
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with running_system(database_url, run_dir / f"{name}-{uuid.uuid4().hex[:6]}") as sys_:
        sys_.stub_set(rules=request.module.RULES)
        yield sys_


@pytest.fixture
async def workers(
    request: pytest.FixtureRequest, temporal_env: WorkflowEnvironment, system: System
) -> AsyncIterator[str]:
    """The module's WORKERS in-process workers on a fresh task queue, which this returns."""
    queue = f"payouts-{uuid.uuid4()}"
    count = getattr(request.module, "WORKERS", 1)
    async with in_process_workers(temporal_env.client, system, queue, count=count):
        yield queue


@pytest.fixture
def lagging_rail(system: System) -> Iterator[None]:
    """The rail's lookups lag far behind: an ambiguous payout stays RAIL_AMBIGUOUS until the
    test lets the rail answer (`system.stub_set(visibility_delay_s=0)`)."""
    system.stub_set(visibility_delay_s=3600)
    yield
    system.stub_set(visibility_delay_s=0)
