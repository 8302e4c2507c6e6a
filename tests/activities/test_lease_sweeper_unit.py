"""UNIT tests of the idle-lease sweeper in PayoutActivities (`HeldGrants`, activities/payout/grants.py).

The lock server's HTTP app runs in-process over the FAKE in-memory backend (the same one the
SDK's unit tests use), because what is under test is the activities' bookkeeping: which grants
count as in use. The store and the proxy are not touched by acquire, release or the sweeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
from temporalio.testing import ActivityEnvironment

from activities import models as m
from activities.payout_activities import PayoutActivities
from common.lockkey import lock_key
from lockservice.sdk import LockClient
from lockservice.server import create_app
from tests.lockservice.fake_backend import FakeBackend
from tests.lockservice.server_fixtures import eventually


@contextlib.asynccontextmanager
async def _activities() -> AsyncIterator[tuple[PayoutActivities, FakeBackend]]:
    backend = FakeBackend()
    transport = httpx.ASGITransport(app=create_app(backend))
    async with LockClient("http://lock", transport=transport) as locks:
        acts = PayoutActivities(
            locks=locks,
            store=cast(Any, None),
            proxy=cast(Any, None),
            worker_queue="q-holder-test",
            worker_id="test",
            lock_url="http://lock",
        )
        yield acts, backend


def _activity_env(started_s_ago: float = 0.0) -> ActivityEnvironment:
    """An activity context whose attempt started `started_s_ago` with a 35 s start-to-close."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        ActivityEnvironment.default_info(),
        started_time=datetime.now(UTC) - timedelta(seconds=started_s_ago),
        start_to_close_timeout=timedelta(seconds=35),
    )
    return env


async def _acquire(acts: PayoutActivities, account: str, started_s_ago: float = 0.0) -> Any:
    ctx = m.WorkContext(correlation_id="c")
    req = m.AcquireRequest("p1", account, 0.0, ctx)
    return await _activity_env(started_s_ago).run(acts.acquire_lock, req)


async def _grant(acts: PayoutActivities, account: str) -> m.StepRequest:
    got = await _acquire(acts, account)
    assert got.acquired
    ctx = m.WorkContext(correlation_id="c")
    return m.StepRequest(payout_id="p1", account_id=account, token=got.token, context=ctx)


async def test_unit_a_grant_won_after_temporal_timed_the_acquire_out_is_given_back() -> None:
    """An acquire that returns after its start-to-close (the worker was starved, the lock
    server slow) would hand its grant to nobody: it releases it and answers 'late'. The same
    acquire within its time is the negative control."""
    async with _activities() as (acts, backend):
        late = await _acquire(acts, "acct-late", started_s_ago=60.0)
        assert not late.acquired and late.reason == "late"
        assert lock_key("acct-late") not in backend.held and not acts.grants
        in_time = await _acquire(acts, "acct-late", started_s_ago=1.0)
        assert in_time.acquired and lock_key("acct-late") in backend.held


async def _until(pred: Any, timeout_s: float = 10.0) -> None:
    async def poll() -> None:
        while not pred():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout_s)  # a failure detector, not a timing assertion


async def test_unit_a_grant_no_step_uses_is_released() -> None:
    """A grant handed to a workflow that never came back (its acquire activity had timed out)
    is released by the sweeper, so the account's later payouts are not blocked for good."""
    async with _activities() as (acts, backend):
        await _grant(acts, "acct-1")
        assert lock_key("acct-1") in backend.held
        sweeper = asyncio.create_task(acts.sweep_idle_leases(idle_s=0.05, every_s=0.01))
        try:
            await _until(lambda: lock_key("acct-1") not in backend.held)
        finally:
            sweeper.cancel()
        assert not acts.grants


async def test_unit_a_grant_with_a_step_running_is_kept() -> None:
    """Negative control: while a step runs under the grant (a long rail submission), however
    long, the sweeper leaves it alone; once the step ends and the grant idles, it goes."""
    async with _activities() as (acts, backend):
        req = await _grant(acts, "acct-2")
        step_may_end = asyncio.Event()

        async def long_step(req: m.StepRequest) -> None:
            async with acts.grants.holding(req):  # as PayoutActivities runs a holder step
                await step_may_end.wait()

        # In an activity context: holder steps heartbeat while they run.
        step = asyncio.create_task(_activity_env().run(long_step, req))
        await eventually(lambda: acts.grants.steps_running(lock_key("acct-2"), req.token) == 1)
        await _grant(acts, "acct-2-idle")  # a witness with no step: proves sweeps happened
        sweeper = asyncio.create_task(acts.sweep_idle_leases(idle_s=0.05, every_s=0.01))
        try:
            await _until(lambda: lock_key("acct-2-idle") not in backend.held)
            assert lock_key("acct-2") in backend.held
            step_may_end.set()
            await step
            await _until(lambda: lock_key("acct-2") not in backend.held)
        finally:
            sweeper.cancel()


async def test_unit_a_released_grant_is_forgotten() -> None:
    """The workflow's own release step removes the bookkeeping, so nothing is swept twice."""
    async with _activities() as (acts, backend):
        req = await _grant(acts, "acct-3")
        await acts.release_lock(req)
        assert lock_key("acct-3") not in backend.held
        assert not acts.grants
