"""UNIT test: every critical-section step heartbeats for as long as it runs (`HeldGrants.holding`
in activities/payout/grants.py), so that a step waiting on a contended row lock is not timed
out by the workflow's short heartbeat timeout as if its worker had died; its first heartbeat
comes after half that timeout, naming the step it is at."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, cast

from temporalio.testing import ActivityEnvironment

from activities import models as m
from activities.payout.grants import HeldGrants
from activities.payout.support import progress


def _holder_step(
    fn: Callable[[m.StepRequest], Coroutine[Any, Any, str]],
) -> Callable[[m.StepRequest], Coroutine[Any, Any, str]]:
    """`fn` run as PayoutActivities runs a holder step: inside `HeldGrants.holding` (this
    process holds no grant here, so only the heartbeat is at work)."""

    async def run(req: m.StepRequest) -> str:
        async with HeldGrants(cast(Any, None)).holding(req):
            return await fn(req)

    return run


async def _until(pred: Any, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.05)


async def test_unit_a_waiting_holder_step_keeps_heartbeating_until_it_ends() -> None:
    """Heartbeats keep coming while the step waits (like post_to_ledger queued on the
    rail_clearing row), and stop once it has returned."""
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    may_end = asyncio.Event()

    async def waiting_step(_req: m.StepRequest) -> str:
        await may_end.wait()
        return "done"

    req = m.StepRequest("p1", "acct-1", 1, m.WorkContext(correlation_id="c"))
    step = asyncio.create_task(env.run(_holder_step(waiting_step), req))
    await _until(lambda: len(beats) >= 2)
    assert not step.done()
    may_end.set()
    assert await step == "done"
    after = len(beats)
    await asyncio.sleep(1.2)  # longer than the 1 s beat interval: a beat would have come
    assert len(beats) == after


def _env(heartbeat_timeout_s: float) -> tuple[ActivityEnvironment, list[tuple[Any, ...]]]:
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, heartbeat_timeout=timedelta(seconds=heartbeat_timeout_s)
    )
    env.on_heartbeat = lambda *details: beats.append(details)
    return env, beats


async def test_unit_a_step_shorter_than_half_its_heartbeat_timeout_sends_no_heartbeat() -> None:
    """The heartbeat timeout runs from the attempt's start: a beat before half of it is an RPC
    (and a write of the workflow's state) Temporal does not need to notice a dead worker."""
    env, beats = _env(heartbeat_timeout_s=60.0)

    async def quick_step(_req: m.StepRequest) -> str:
        progress("claim", "PENDING")
        return "done"

    req = m.StepRequest("p1", "acct-1", 1, m.WorkContext(correlation_id="c"))
    assert await env.run(_holder_step(quick_step), req) == "done"
    assert beats == []


async def test_unit_a_step_past_half_its_heartbeat_timeout_beats_naming_its_step() -> None:
    env, beats = _env(heartbeat_timeout_s=0.2)

    async def slow_step(_req: m.StepRequest) -> str:
        progress("submit", "CLAIMED")
        await _until(lambda: len(beats) >= 1)
        return "done"

    req = m.StepRequest("p1", "acct-1", 1, m.WorkContext(correlation_id="c"))
    assert await env.run(_holder_step(slow_step), req) == "done"
    assert beats[0] == ({"step": "submit", "state": "CLAIMED"},)
