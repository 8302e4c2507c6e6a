"""Orchestration tests of PayoutWorkflow with MOCK activities on a real Temporal dev server: the
operator's abandon and revoke signals, and what never fails the workflow (issue 12.3): a lock
service outage, failing lookups and escalations, invalid payloads, an unknown state, and
continue-as-new with a revoke pending or in flight."""

from __future__ import annotations

import asyncio

from temporalio.testing import WorkflowEnvironment

from activities import models as m
from tests.workflows.orchestration import new_world, running, start, wait_status
from workflows.payout import PayoutWorkflow


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


# ---------------------------------------------------------------------- never fails (issue 12.3)

RESILIENT = {"read_retry_max_interval_s": 0.1}
#: Attempts the bounded read policy allowed before issue 12 (maximum_attempts=4).
OLD_READ_ATTEMPTS = 4


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
