"""Orchestration tests of PayoutWorkflow with MOCK activities on a real Temporal dev server:
which step runs next, under which token, and what never happens (a second submit), from the
happy path in both shapes through declines, fencing, outages, lookups and a dead holder queue."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from tests.workflows.orchestration import new_world, running, start
from workflows.payout import PayoutWorkflow


async def test_happy_path_runs_uc01_steps_in_order(temporal_env: WorkflowEnvironment) -> None:
    """acquire, claim, submit, post, release: one submit, all under the same token, inside ONE
    activity on the shared queue (issue 29) that also released the
    grant: 2 workflow tasks and 1 activity per payout."""
    world = new_world()
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q)
        result = await handle.result()
    assert result.state == "POSTED"
    assert world.names() == ["acquire:ok", "claim", "submit", "post", "release"]
    assert {t for n, t in world.calls if n in ("claim", "submit", "post", "release")} == {1}
    assert world.executes == [(1, ["claim", "submit", "post", "release"])]
    scheduled, tasks = await _shape(handle)
    assert [a.activity_type.name for a in scheduled] == [m.ACQUIRE_AND_EXECUTE]
    # It may reach the submit: one attempt, never retried by Temporal.
    assert scheduled[0].retry_policy.maximum_attempts == 1
    assert tasks == 2  # 3 with the acquire and the merged step apart, 6 before the merge


async def test_the_three_task_shape_is_kept_for_the_ab(temporal_env: WorkflowEnvironment) -> None:
    """two_task=False (bench-e2e's A/B): the acquire, then the merged holder step on the
    holder's own queue, 3 workflow tasks; the same steps and the same single submit."""
    world = new_world()
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, two_task=False)
        result = await handle.result()
    assert result.state == "POSTED"
    assert world.executes == [(1, ["claim", "submit", "post", "release"])]
    scheduled, tasks = await _shape(handle)
    assert [a.activity_type.name for a in scheduled] == [m.ACQUIRE_LOCK, m.EXECUTE_PAYOUT]
    assert scheduled[1].retry_policy.maximum_attempts == 1
    assert tasks == 3


async def _shape(handle: WorkflowHandle[PayoutWorkflow, m.PayoutStatus]) -> tuple[list[Any], int]:
    """The activities a run scheduled, and how many workflow tasks it completed."""
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    tasks = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    return scheduled, len(tasks)


async def test_a_failure_after_the_merged_submit_recovers_by_evidence_without_resubmitting(
    temporal_env: WorkflowEnvironment,
) -> None:
    """The rail acknowledged and the proxy recorded it, then the merged activity failed before
    the payment database recorded the submission: no retry of the activity, no second submit;
    the next grant reads the proxy's attempt record (ACKED) and completes the payout from it."""
    world = new_world(submit_script=["ack_then_fail"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "POSTED"
    assert [t for n, t in world.calls if n == "submit"] == [1]
    assert world.failed_attempts == {"submit": 1}  # the merged activity ran once at token 1
    after = world.calls[world.calls.index(("submit", 1)) + 1 :]
    assert after == [
        ("release", 1),  # the failed critical section's separate release
        ("acquire:ok", 0),
        ("claim", 2),
        ("recover", 2),  # the attempt record (ACKED) decides: RAIL_ACKED, never a resubmit
        ("post", 2),
        ("release", 2),
    ]
    assert world.executes == [(2, ["claim"])]  # found CLAIMED: handed to state-based recovery


async def test_decline_fails_without_posting(temporal_env: WorkflowEnvironment) -> None:
    """A business decline ends in FAILED with no ledger posting."""
    world = new_world(submit_script=["decline"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "FAILED"
    assert "post" not in world.names()


async def test_insufficient_funds_never_reaches_the_rail(temporal_env: WorkflowEnvironment) -> None:
    """A claim that finds insufficient funds ends in FAILED and no submit happens."""
    world = new_world(funds_ok=False)
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "FAILED"
    assert "submit" not in world.names()


async def test_fenced_out_aborts_and_reacquires_with_a_higher_token(
    temporal_env: WorkflowEnvironment,
) -> None:
    """After a fenced rejection nothing more runs under that token; the next step uses a new one."""
    world = new_world(claim_script=["fenced"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "POSTED"
    claims = [t for n, t in world.calls if n == "claim"]
    assert claims == [1, 2]
    after_fence = [
        t for n, t in world.calls[world.calls.index(("claim", 1)) + 1 :] if n in ("submit", "post")
    ]
    assert 1 not in after_fence


async def test_lock_service_unavailable_fails_closed_then_proceeds(
    temporal_env: WorkflowEnvironment,
) -> None:
    """With the lock service down nothing executes; once it returns, the payout runs once."""
    world = new_world(acquire_script=["unavailable", "unavailable", "held"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "POSTED"
    names = world.names()
    assert names[:3] == ["acquire:unavailable", "acquire:unavailable", "acquire:held"]
    assert names.count("submit") == 1
    assert names.index("submit") > names.index("acquire:ok")


async def test_not_submitted_is_retried_under_a_new_grant(
    temporal_env: WorkflowEnvironment,
) -> None:
    """NOT_SUBMITTED (e.g. circuit open) allows a new attempt, only after re-acquiring."""
    world = new_world(submit_script=["not_submitted", "ack"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "POSTED"
    assert [t for n, t in world.calls if n == "submit"] == [1, 2]


async def test_ambiguous_is_resolved_by_lookup_never_resubmitted(
    temporal_env: WorkflowEnvironment,
) -> None:
    """An unknown outcome is looked up until settled, then posted; submit ran exactly once."""
    world = new_world(submit_script=["unknown"], lookup_script=["pending", "pending", "settled"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "POSTED"
    names = world.names()
    assert names.count("submit") == 1
    assert names.count("lookup:pending") == 2
    assert "resolve:settled" in names and names.index("post") > names.index("resolve:settled")


async def test_ambiguous_absent_fails(temporal_env: WorkflowEnvironment) -> None:
    """A lookup that says definitively absent moves the payout to FAILED without a resubmit."""
    world = new_world(submit_script=["unknown"], lookup_script=["absent"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "FAILED"
    assert world.names().count("submit") == 1 and "resolve:absent" in world.names()


async def test_dead_holder_queue_leads_to_reacquire(temporal_env: WorkflowEnvironment) -> None:
    """If the holder's worker is gone (nobody polls its queue), the workflow re-acquires. (The
    three-task shape: in the two-task one the first critical section runs in the acquiring
    activity itself, and a dead holder queue only meets the recovery steps.)"""
    world = new_world(acquire_script=["dead_queue"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q, two_task=False)).result()
    assert result.state == "POSTED"
    assert world.names()[0] == "acquire:dead_queue"
    assert [t for n, t in world.calls if n == "submit"] == [2]
