"""UNIT test: every critical-section step heartbeats for as long as it runs (`_holder_step` in
activities/payout/base.py), so that a step waiting on a contended row lock is not timed
out by the workflow's short heartbeat timeout as if its worker had died."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from temporalio.testing import ActivityEnvironment

from activities import models as m
from activities.payout_activities import PayoutActivities, _holder_step


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

    async def waiting_step(_self: PayoutActivities, _req: m.StepRequest) -> str:
        await may_end.wait()
        return "done"

    acts = cast(PayoutActivities, type("Acts", (), {"_leases": {}})())
    req = m.StepRequest("p1", "acct-1", 1, m.WorkContext(correlation_id="c"))
    step = asyncio.create_task(env.run(_holder_step(waiting_step), acts, req))
    await _until(lambda: len(beats) >= 2)
    assert not step.done()
    may_end.set()
    assert await step == "done"
    after = len(beats)
    await asyncio.sleep(1.2)  # longer than the 1 s beat interval: a beat would have come
    assert len(beats) == after
