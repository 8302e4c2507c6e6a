"""What a person can do to a payout workflow beyond signals, end to end (issue 24, on the real
Temporal dev server and `temporal` CLI, the real `payouts` console script, PostgreSQL and the
lock server, rail proxy and rail stub as real processes): `payouts payout abandon` gets the
workflow's verdict, a cancellation request is refused and audited while the payout goes on, and
a terminated or reset workflow's payout is driven again by evidence and paid once."""

from __future__ import annotations

import base64
import json

from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.credentials import OPERATOR
from tests.workflows.integration import record
from tests.workflows.operator_tools import (
    RULES,
    ambiguous,
    audit_details,
    payouts,
    temporal,
    temporal_address,
    until,
)
from tests.workflows.system import System, wait_for
from workflows.payout import PayoutWorkflow

__all__ = ["RULES"]  # the rail stub's, for the `system` fixture (tests/workflows/conftest.py)


async def _timer_summaries(address: str, workflow_id: str) -> list[str]:
    """The summary of every timer in the workflow's history, as `temporal workflow show` gives
    it (the history the UI's Event History and Timeline render): each TimerStarted event's
    user metadata, its payload decoded."""
    shown = await temporal(address, "workflow", "show", "--workflow-id", workflow_id, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    summaries = []
    for event in json.loads(shown.stdout)["events"]:
        if event.get("eventType") != "EVENT_TYPE_TIMER_STARTED":
            continue
        summary = event.get("userMetadata", {}).get("summary", {})
        summaries.append(json.loads(base64.b64decode(summary["data"])) if summary else "")
    return summaries


async def test_the_cli_gets_the_workflows_verdict(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """`payouts payout abandon` of a payout whose SLA cannot have escalated (4 hours): refused
    by the workflow's validator, one line, exit 4, nothing entered the history. Of one whose SLA
    escalated: carried out, exit 0, as the authenticated operator."""
    address = temporal_address(temporal_env)
    early_id, _, early_handle = await ambiguous(temporal_env, system, workers)
    early = await payouts(system, address, "payout", "abandon", early_id, "--reason", "too early")
    assert early.returncode == 4, early
    (line,) = early.stderr.strip().splitlines()
    assert "refused" in line and "resolution SLA" in line
    assert not any(
        e.HasField("workflow_execution_update_accepted_event_attributes")
        for e in (await early_handle.fetch_history()).events
    )
    payout_id, _, handle = await ambiguous(temporal_env, system, workers, resolution_sla_s=0.5)
    await until(handle, lambda s: s.escalated)
    done = await payouts(system, address, "payout", "abandon", payout_id, "--reason", "ticket 11")
    assert done.returncode == 0, done
    assert "carried out" in done.stdout and OPERATOR in done.stdout
    assert (await handle.result()).state == "ABANDONED"
    await record(handle, "commands_update_abandon_carried_out")
    system.stub_set(visibility_delay_s=0)
    assert (await early_handle.result()).state == "POSTED"


async def test_a_cancellation_request_is_refused_and_the_payout_goes_on(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """`temporal workflow cancel` (what the UI's Request Cancellation sends) on a RAIL_AMBIGUOUS
    payout: audited as refused, the workflow keeps running and posts the payout once the rail
    answers."""
    address = temporal_address(temporal_env)
    payout_id, _, handle = await ambiguous(temporal_env, system, workers)
    cancel = await temporal(address, "workflow", "cancel", "--workflow-id", f"payout-{payout_id}")
    assert cancel.returncode == 0, cancel.stderr

    async def audited() -> bool:
        return bool(await audit_details(system, payout_id, "signal_rejected:cancel"))

    await wait_for(audited, timeout_s=60)
    status = await handle.query(PayoutWorkflow.status)
    assert status.cancel_requests == 1 and status.state == "RAIL_AMBIGUOUS"
    # Issue 28 §1: its lookup timer says what it waits for, in the history the UI shows.
    summaries = await _timer_summaries(address, f"payout-{payout_id}")
    expected = "next lookup of the rail in 0.3s (sooner for an accepted abandon)"
    assert summaries and all(t == expected for t in summaries), summaries
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    system.stub_set(visibility_delay_s=0)
    result = await handle.result()
    await record(handle, "commands_cancel_refused")
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1


async def test_a_terminated_payout_is_driven_again_by_evidence(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """`temporal workflow terminate` leaves a RAIL_AMBIGUOUS payout with nothing driving it;
    `payouts payout start-pending` finds it and starts a new workflow, which looks it up (never
    submits it again) and posts it once the rail answers: one movement."""
    address = temporal_address(temporal_env)
    payout_id, _, _ = await ambiguous(temporal_env, system, workers)
    wid = ["--workflow-id", f"payout-{payout_id}", "--reason", "operator mistake"]
    assert (await temporal(address, "workflow", "terminate", *wid)).returncode == 0
    env_db = ["--database-url", system.database_url, "--task-queue", workers]
    env_db += ["--payout", payout_id]  # the session database holds other tests' payouts too
    out = await payouts(system, address, "payout", "start-pending", *env_db)
    assert out.returncode == 0, out
    assert "started 1 workflow(s)" in out.stdout and "1 RAIL_AMBIGUOUS" in out.stdout
    again = temporal_env.client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")
    await until(again, lambda s: s.lookups >= 1)
    system.stub_set(visibility_delay_s=0)
    result = await again.result()
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1
    second = await payouts(system, address, "payout", "start-pending", *env_db)
    assert "started 0 workflow(s)" in second.stdout  # a completed one is never started again


async def test_a_reset_payout_goes_on_by_evidence_and_pays_once(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """`temporal workflow reset --type FirstWorkflowTask` (the UI's Reset) of a RAIL_AMBIGUOUS
    payout: the new run re-executes from its start, re-reads the payout under a fresh grant,
    finds it ambiguous and looks it up (never submits it again); posted once the rail answers."""
    address = temporal_address(temporal_env)
    payout_id, _, handle = await ambiguous(temporal_env, system, workers)
    first_token = (await handle.query(PayoutWorkflow.status)).token
    reset = await temporal(
        address,
        "workflow",
        "reset",
        "--workflow-id",
        f"payout-{payout_id}",
        "--type",
        "FirstWorkflowTask",
        "--reason",
        "operator drill",
    )
    assert reset.returncode == 0, reset.stderr
    latest = temporal_env.client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")
    status = await until(latest, lambda s: s.lookups >= 1 and s.token > first_token)
    assert status.state == "RAIL_AMBIGUOUS"
    system.stub_set(visibility_delay_s=0)
    result = await latest.result()
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1
