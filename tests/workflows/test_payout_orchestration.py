"""Orchestration tests of PayoutWorkflow with MOCK activities on a real Temporal dev server:
which step runs next, under which token, and what never happens (a second submit)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import models as m
from tests.workflows.mock_world import MockWorld
from workflows.payout import PayoutWorkflow

FAST = {
    "acquire_wait_s": 0.1,
    "base_backoff_s": 0.05,
    "max_backoff_s": 0.2,
    "lookup_interval_s": 0.2,
    "holder_pickup_s": 1.0,
}


@asynccontextmanager
async def running(env: WorkflowEnvironment, world: MockWorld) -> AsyncIterator[str]:
    shared = f"shared-{uuid.uuid4()}"
    acts = world.activities()
    async with (
        Worker(env.client, task_queue=shared, workflows=[PayoutWorkflow], activities=acts),
        Worker(env.client, task_queue=world.holder_queue, activities=acts),
    ):
        yield shared


def new_world(**kw: object) -> MockWorld:
    return MockWorld(holder_queue=f"holder-{uuid.uuid4()}", **kw)  # type: ignore[arg-type]


async def start(
    env: WorkflowEnvironment, queue: str, **kw: float
) -> WorkflowHandle[PayoutWorkflow, m.PayoutStatus]:
    inp = m.PayoutInput(payout_id="po-1", account_id="acct-1", **{**FAST, **kw})  # type: ignore[arg-type]
    return await env.client.start_workflow(
        PayoutWorkflow.run, inp, id=f"payout-test-{uuid.uuid4()}", task_queue=queue
    )


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


async def test_abandon_is_rejected_before_sla_and_accepted_after(
    temporal_env: WorkflowEnvironment,
) -> None:
    """abandon before escalation (or without a reason) is rejected and audited; after it, accepted."""
    world = new_world(submit_script=["unknown"], lookup_script=[])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, resolution_sla_s=1.0)
        while (await handle.query(PayoutWorkflow.status)).state != "RAIL_AMBIGUOUS":
            await asyncio.sleep(0.05)
        await handle.signal("abandon", m.OperatorCommand(operator="alice", reason="too early"))
        await handle.signal("abandon", m.OperatorCommand(operator="alice", reason=""))
        while not (await handle.query(PayoutWorkflow.status)).escalated:
            await asyncio.sleep(0.05)
        await handle.signal(
            "abandon",
            m.OperatorCommand(operator="alice", reason="rail confirms nothing"),
        )
        result = await handle.result()
    assert result.state == "ABANDONED"
    assert [r.why for r in result.rejected_signals] == [
        "abandon is only valid after the resolution SLA has escalated",
        "a reason is required",
    ]
    assert len(world.rejected) == 2
    assert world.escalations == 1
    # Carried out as the identity the payment store verified (MOCK: "verified:<name>").
    assert "abandon:verified:alice" in world.names() and world.names().count("submit") == 1


async def test_revoke_signal_force_revokes_through_the_lock_service(
    temporal_env: WorkflowEnvironment,
) -> None:
    """A valid revoke runs the revoke activity with operator and reason; an invalid one is rejected."""
    world = new_world(submit_script=["unknown"], lookup_script=[])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, resolution_sla_s=3600)
        while (await handle.query(PayoutWorkflow.status)).state != "RAIL_AMBIGUOUS":
            await asyncio.sleep(0.05)
        await handle.signal("revoke", m.OperatorCommand(operator="", reason="x"))
        await handle.signal("revoke", m.OperatorCommand(operator="bob", reason="stuck holder"))
        while not world.revokes:
            await asyncio.sleep(0.05)
        status = await handle.query(PayoutWorkflow.status)
        await handle.terminate("test done")
    assert world.revokes[0].operator == "bob" and world.revokes[0].account_id == "acct-1"
    assert [r.why for r in status.rejected_signals] == ["an operator identity is required"]


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


# ---------------------------------------------------------------------- never fails (issue 12.3)

RESILIENT = {"read_retry_max_interval_s": 0.1}
#: Attempts the bounded read policy allowed before issue 12 (maximum_attempts=4).
OLD_READ_ATTEMPTS = 4


async def wait_status(
    handle: WorkflowHandle[PayoutWorkflow, m.PayoutStatus],
    pred: Callable[[m.PayoutStatus], bool],
    timeout_s: float = 60.0,
) -> m.PayoutStatus:
    """Poll the status query of the workflow's latest run until `pred` holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = await handle.query(PayoutWorkflow.status)
        if pred(status):
            return status
        assert asyncio.get_running_loop().time() < deadline, f"never reached: {status}"
        await asyncio.sleep(0.05)


async def test_revoke_during_a_lock_service_outage_is_carried_out_when_it_returns(
    temporal_env: WorkflowEnvironment,
) -> None:
    """A revoke whose activity fails past the old retry budget does not fail the workflow: it
    stays pending, the payout goes on, and the revoke is carried out once the service returns."""
    world = new_world(submit_script=["unknown"], lookup_script=[], lock_service_down=True)
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, resolution_sla_s=3600, **RESILIENT)
        await wait_status(handle, lambda s: s.state == "RAIL_AMBIGUOUS")
        await handle.signal("revoke", m.OperatorCommand(operator="bob", reason="stuck holder"))
        while world.failed_attempts.get("revoke", 0) <= OLD_READ_ATTEMPTS:
            await asyncio.sleep(0.05)
        assert (await handle.query(PayoutWorkflow.status)).pending_revokes == 1
        world.lock_service_down = False
        await wait_status(handle, lambda s: s.pending_revokes == 0)
        world.lookup_script = ["settled"]
        result = await handle.result()
    assert result.state == "POSTED"
    assert [r.operator for r in world.revokes] == ["bob"]
    assert result.rejected_signals == []


async def test_lookups_and_escalation_failing_past_the_old_budget_only_delay(
    temporal_env: WorkflowEnvironment,
) -> None:
    """Failing lookups and a failing escalation are retried past 4 attempts; the payout is then
    escalated, abandoned by an operator and ends ABANDONED (submitted once)."""
    world = new_world(
        submit_script=["unknown"], lookup_script=[], lookup_failures=6, escalate_failures=6
    )
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, resolution_sla_s=0.5, **RESILIENT)
        await wait_status(handle, lambda s: s.escalated)
        await handle.signal("abandon", m.OperatorCommand(operator="ana", reason="rail: no record"))
        result = await handle.result()
    assert result.state == "ABANDONED"
    assert world.failed_attempts == {"lookup": 6, "escalate": 6}
    assert world.escalations == 1 and world.names().count("submit") == 1


async def test_invalid_signal_payloads_are_rejected_and_audited_not_fatal(
    temporal_env: WorkflowEnvironment,
) -> None:
    """A payload that is not an operator command, or none at all, is rejected and audited; the
    workflow goes on and completes."""
    world = new_world(submit_script=["unknown"], lookup_script=[])
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, resolution_sla_s=3600, **RESILIENT)
        await wait_status(handle, lambda s: s.state == "RAIL_AMBIGUOUS")
        await handle.signal("abandon", "not a command")
        await handle.signal("revoke", {"operator": 42, "reason": "x"})
        await handle.signal("revoke")
        await wait_status(handle, lambda s: len(s.rejected_signals) == 3)
        world.lookup_script = ["settled"]
        result = await handle.result()
    assert result.state == "POSTED"
    whys = [r.why for r in result.rejected_signals]
    assert whys[0].startswith("invalid payload") and whys[1].startswith("invalid payload")
    assert whys[2] == "invalid payload: one operator command expected, got 0 arguments"
    assert len(world.rejected) == 3 and world.revokes == []


async def test_an_unexpected_state_backs_off_and_reads_again(
    temporal_env: WorkflowEnvironment,
) -> None:
    """A state the workflow does not know is reported and retried under a new grant, not fatal."""
    world = new_world(claim_script=["SOMETHING_NEW"])
    async with running(temporal_env, world) as q:
        result = await (await start(temporal_env, q)).result()
    assert result.state == "POSTED"
    assert [t for n, t in world.calls if n == "claim"] == [1, 2]
    assert world.names().count("submit") == 1


async def test_continue_as_new_carries_escalation_and_an_accepted_abandon(
    temporal_env: WorkflowEnvironment,
) -> None:
    """Past max_lookups_per_run the workflow continues as new; the escalation (and when the
    ambiguity began) survives, it is not escalated again, and an abandon sent to the latest run
    is carried out."""
    world = new_world(submit_script=["unknown"], lookup_script=[])
    async with running(temporal_env, world) as q:
        started = await start(temporal_env, q, resolution_sla_s=0.5, max_lookups_per_run=3)
        latest = temporal_env.client.get_workflow_handle_for(PayoutWorkflow.run, started.id)
        await wait_status(latest, lambda s: s.escalated and s.runs >= 3)
        await latest.signal("abandon", m.OperatorCommand(operator="ana", reason="rail: no record"))
        result = await latest.result()
        first = await temporal_env.client.get_workflow_handle(
            started.id, run_id=started.first_execution_run_id
        ).describe()
    assert result.state == "ABANDONED" and result.escalated and result.runs >= 3
    assert first.status is not None and first.status.name == "CONTINUED_AS_NEW"
    assert world.escalations == 1
    assert world.names().count("submit") == 1
    assert world.names().count("lookup:pending") >= 6


async def test_continue_as_new_carries_a_pending_revoke(
    temporal_env: WorkflowEnvironment,
) -> None:
    """A revoke still waiting for the lock service when the run continues as new is carried to
    the next run and carried out there."""
    world = new_world(submit_script=["unknown"], lookup_script=[], lock_service_down=True)
    async with running(temporal_env, world) as q:
        started = await start(
            temporal_env, q, resolution_sla_s=3600, max_lookups_per_run=3, **RESILIENT
        )
        latest = temporal_env.client.get_workflow_handle_for(PayoutWorkflow.run, started.id)
        await wait_status(latest, lambda s: s.state == "RAIL_AMBIGUOUS")
        await latest.signal("revoke", m.OperatorCommand(operator="bob", reason="stuck holder"))
        await wait_status(latest, lambda s: s.runs >= 2 and s.pending_revokes == 1)
        world.lock_service_down = False
        await wait_status(latest, lambda s: s.pending_revokes == 0)
        world.lookup_script = ["settled"]
        result = await latest.result()
    assert result.state == "POSTED" and result.runs >= 2
    assert {r.operator for r in world.revokes} == {"bob"}
    assert result.rejected_signals == []


async def test_a_revoke_still_pending_when_the_payout_ends_is_reported_not_carried_out(
    temporal_env: WorkflowEnvironment,
) -> None:
    """A payout that becomes terminal while its revoke waits for the lock service reports the
    revoke as rejected (the account's lock may belong to its next payout by then) and completes."""
    world = new_world(submit_script=["unknown"], lookup_script=[], lock_service_down=True)
    async with running(temporal_env, world) as q:
        handle = await start(temporal_env, q, resolution_sla_s=3600, **RESILIENT)
        await wait_status(handle, lambda s: s.state == "RAIL_AMBIGUOUS")
        await handle.signal("revoke", m.OperatorCommand(operator="bob", reason="stuck holder"))
        await wait_status(handle, lambda s: s.pending_revokes == 1)
        world.lookup_script = ["settled"]
        result = await handle.result()
    assert result.state == "POSTED" and result.pending_revokes == 0
    assert [r.why for r in result.rejected_signals] == [
        "payout reached POSTED before the revoke was carried out"
    ]
    # Accepted by the (MOCK) payment store, so its end is recorded there, not as a new rejection.
    assert world.revokes == [] and world.rejected == []
    assert [s.why for s in world.settled] == [
        "payout reached POSTED before the revoke was carried out"
    ]


async def test_a_revoke_in_flight_when_the_run_continues_as_new_is_carried_out_once(
    temporal_env: WorkflowEnvironment,
) -> None:
    """Continue-as-new falls due while a revoke's attempt is in flight: the run waits for that
    attempt instead of cancelling it (the SDK erases the result of an activity cancelled in the
    activation that completes it, and the next run carried the revoke out a second time). The
    revoke is recorded as carried out, not carried over, and done once (issue 24, item 7)."""
    gate = asyncio.Event()
    world = new_world(submit_script=["unknown"], lookup_script=[], revoke_gate=gate)
    async with running(temporal_env, world) as q:
        started = await start(
            temporal_env, q, resolution_sla_s=3600, max_lookups_per_run=3, **RESILIENT
        )
        latest = temporal_env.client.get_workflow_handle_for(PayoutWorkflow.run, started.id)
        await wait_status(latest, lambda s: s.state == "RAIL_AMBIGUOUS")
        await latest.signal("revoke", m.OperatorCommand(operator="bob", reason="stuck holder"))
        while "revoke_in_flight" not in world.names():
            await asyncio.sleep(0.05)
        # Lookups go on meanwhile; the run reaches its continue-as-new point and waits there.
        while world.names().count("lookup:pending") < 3:
            await asyncio.sleep(0.05)
        gate.set()
        status = await wait_status(latest, lambda s: s.runs >= 2)
        world.lookup_script = ["settled"]
        result = await latest.result()
    assert [r.operator for r in world.revokes] == ["bob"]  # once, not again by the next run
    assert status.pending_revokes == 0
    assert [c.status for c in status.commands if c.action == "revoke"] == ["carried_out"]
    assert result.state == "POSTED" and result.rejected_signals == []
