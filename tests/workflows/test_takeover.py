"""Takeover after a frozen holder (issue 16), with MOCK activities on a real Temporal dev server:
a task that a frozen worker's open long-poll took (it never answers nor heartbeats) is given to
another worker after the holder heartbeat timeout, not after the step's whole start-to-close,
and the payout is executed by the next grant. The deadlines below are far shorter than the old
timeouts (acquire_wait_s + 5 s; two 10 s releases), so the old behaviour fails them; they are
deadlines for a recorded fact, not measured timings. Fencing, which keeps the frozen holder's
late writes out, is covered with the real components by tests/experiments."""

from __future__ import annotations

from temporalio.testing import WorkflowEnvironment

from tests.workflows.test_payout_orchestration import new_world, running, start, wait_status

#: Short holder timeouts, as the pause experiment uses; a long acquire wait, as production has.
TAKEOVER = {"holder_heartbeat_timeout_s": 1.0, "acquire_wait_s": 300.0}


async def test_an_acquire_a_frozen_worker_took_is_retried_and_the_payout_completes(
    temporal_env: WorkflowEnvironment,
) -> None:
    world = new_world(acquire_script=["frozen"], submit_script=["ack"])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, **TAKEOVER)
        # Without the acquire's heartbeat timeout the frozen attempt would hold the payout for
        # acquire_wait_s + 5 s = 305 s.
        status = await wait_status(handle, lambda s: s.state == "POSTED", timeout_s=30)
    assert world.names()[:2] == ["acquire:frozen", "acquire:ok"]
    assert status.token == 1  # the frozen attempt issued no grant; the next acquire's is 1
    assert [t for n, t in world.calls if n == "submit"] == [1]


async def test_a_frozen_holder_is_released_once_and_the_next_grant_executes(
    temporal_env: WorkflowEnvironment,
) -> None:
    world = new_world(submit_script=["frozen", "ack"], release_script=["frozen"])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, **TAKEOVER)
        status = await wait_status(handle, lambda s: s.state == "POSTED", timeout_s=30)
        # POSTED is visible before the last release has run: the run's end is after it.
        await handle.result()
    # The frozen holder's submit timed out by heartbeat; its release was tried ONCE (it froze
    # too), not retried onto the same frozen queue; the next grant (token 2) did the work.
    assert [t for n, t in world.calls if n == "submit"] == [1, 2]
    assert [t for n, t in world.calls if n == "release"] == [1, 2]
    assert status.token == 2
