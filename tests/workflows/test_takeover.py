"""Takeover after a frozen holder (issue 16), with MOCK activities on a real Temporal dev server:
a task that a frozen worker's open long-poll took (it never answers nor heartbeats) is given to
another worker after the holder heartbeat timeout, not after the step's whole start-to-close,
and the payout is executed by the next grant. The deadlines below are far shorter than the old
timeouts (acquire_wait_s + 5 s; two 10 s releases), so the old behaviour fails them; they are
deadlines for a recorded fact, not measured timings. Fencing, which keeps the frozen holder's
late writes out, is covered with the real components at the end of this file (and by
tests/lab/test_experiments.py), on both lock backends."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from lab.experiments.harness import default_config
from lab.experiments.pause import pause_experiment
from stack.config import StackConfig
from tests.workflows.orchestration import new_world, running, start, wait_status

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
    """The three-task shape (two_task=False): the frozen holder's step is on its own queue."""
    world = new_world(submit_script=["frozen", "ack"], release_script=["frozen"])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, two_task=False, **TAKEOVER)
        status = await wait_status(handle, lambda s: s.state == "POSTED", timeout_s=30)
        # POSTED is visible before the last release has run: the run's end is after it.
        await handle.result()
    # The frozen holder's submit timed out by heartbeat; its release was tried ONCE (it froze
    # too), not retried onto the same frozen queue; the next grant (token 2) did the work.
    assert [t for n, t in world.calls if n == "submit"] == [1, 2]
    assert [t for n, t in world.calls if n == "release"] == [1, 2]
    assert status.token == 2


async def test_the_next_acquire_does_not_wait_for_a_frozen_holders_release(
    temporal_env: WorkflowEnvironment,
) -> None:
    """The three-task shape (two_task=False)."""
    world = new_world(submit_script=["frozen", "ack"], release_script=["frozen"])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, two_task=False, **TAKEOVER)
        await wait_status(handle, lambda s: s.state == "POSTED", timeout_s=30)
        status = await handle.result()  # the run waits for the background release to end
        history = await handle.fetch_history()
    scheduled: dict[int, str] = {}
    order: list[str] = []
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[e.event_id] = name
            order.append(f"scheduled:{name}")
        elif e.HasField("activity_task_timed_out_event_attributes"):
            sid = e.activity_task_timed_out_event_attributes.scheduled_event_id
            order.append(f"timed_out:{scheduled[sid]}")
    # The frozen holder's release (token 1) is scheduled beside the second acquire, and that
    # acquire is scheduled before the release has ended: the takeover no longer waits out the
    # release's timeout on the frozen holder's queue.
    first_release = order.index(f"scheduled:{m.RELEASE_LOCK}")
    second_acquire = [i for i, o in enumerate(order) if o == f"scheduled:{m.ACQUIRE_LOCK}"][1]
    assert abs(first_release - second_acquire) == 1
    assert order.index(f"timed_out:{m.RELEASE_LOCK}") > second_acquire
    assert [t for n, t in world.calls if n == "release"] == [1, 2]
    assert status.token == 2


async def test_a_holder_frozen_in_the_two_task_step_is_taken_over_at_once(
    temporal_env: WorkflowEnvironment,
) -> None:
    """The two-task shape: a worker frozen inside acquire_and_execute (after its grant, in the
    submit) is timed out by heartbeat; its grant's token never reached the workflow, so no
    release is scheduled for it, and the next acquire_and_execute is scheduled at once and
    does the work under a higher token (the frozen holder's session expiry frees its lock; the
    fences refuse its late writes). Only the next grant's release is scheduled."""
    world = new_world(submit_script=["frozen", "ack"])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, **TAKEOVER)
        await wait_status(handle, lambda s: s.state == "POSTED", timeout_s=30)
        status = await handle.result()
        history = await handle.fetch_history()
    names = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    # The second run found the payout CLAIMED with no attempt on record (MOCK: the frozen
    # submit never reached the proxy), so it went on by the state-based steps.
    assert names[:2] == [m.ACQUIRE_AND_EXECUTE, m.ACQUIRE_AND_EXECUTE]
    assert m.RELEASE_LOCK in names
    assert [t for n, t in world.calls if n == "submit"] == [1, 2]
    assert [t for n, t in world.calls if n == "release"] == [2]
    assert status.token == 2


# --------------------------------------------------------------------------- the real stack


@pytest.fixture
def stack_config(
    run_dir: Path, request: pytest.FixtureRequest, external_database_url: str | None
) -> StackConfig:
    cfg = default_config(request.param, run_dir / f"takeover-{uuid.uuid4().hex[:6]}")
    # On $DATABASE_URL's server, if set, a database of the run's own.
    return replace(cfg, database_url=external_database_url) if external_database_url else cfg


def _after_holder_timeout(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history from the frozen holder's timed-out step on (the first activity that timed
    out: W1 froze inside it)."""
    first = next(i for i, e in enumerate(timeline) if e["event"] == "activity_task_timed_out")
    return timeline[first:]


@pytest.mark.slow
@pytest.mark.parametrize("stack_config", ["postgres", "etcd"], indirect=True)
async def test_the_next_holder_gets_the_lock_and_the_frozen_one_is_fenced(
    stack_config: StackConfig, run_dir: Path
) -> None:
    """UC-03 with real processes (the pause experiment: W1 SIGSTOPped between its grant check
    and its rail call, W2 started): W2's grant is higher, W1's late writes are refused by the
    proxy and the payment database (one rail movement, one fenced-out event); and the takeover
    took the short path: W1 froze inside the two-task step (acquire_and_execute), whose grant's
    token never reached the workflow, so the very next activity is W2's acquire_and_execute,
    which completed (no release on W1's frozen queue to wait for)."""
    result = await pause_experiment(stack_config, fencing=True, evidence_dir=run_dir / "ev")
    assert result["ok"], result["checks"]
    assert result["t2"] > result["t1"]
    assert result["rail_movements"] == 1 and result["fenced_out_events"] == 1
    after = _after_holder_timeout(result["timeline"])
    timed_out = after[0]
    first_timed_out = next(
        e for e in result["timeline"] if e["id"] == timed_out["scheduled_event_id"]
    )
    assert first_timed_out["activity_type"] == m.ACQUIRE_AND_EXECUTE
    scheduled = [e for e in after if e["event"] == "activity_task_scheduled"]
    assert scheduled[0]["activity_type"] == m.ACQUIRE_AND_EXECUTE
    completed = {e["scheduled_event_id"] for e in after if e["event"] == "activity_task_completed"}
    assert scheduled[0]["id"] in completed
