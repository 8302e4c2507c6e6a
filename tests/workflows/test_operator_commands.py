"""What a person can send a payout workflow, end to end (issue 24): the real Temporal dev server
and `temporal` CLI, the real `payouts` console script, PostgreSQL, the lock server, the rail proxy
and the rail stub as real processes, the real activities.

- Evidence outranks an abandon: once a lookup found the payout settled, an abandon is refused
  naming the evidence, and the payout is posted.
- A signal with two arguments, or a payload the converter cannot decode, is refused and audited
  and the workflow goes on (it used to wedge on every workflow task, or be dropped unaudited).
- A forged abandon sent after a signed one is refused on its own; the signed one is carried out.
- An operator assertion is single-use: sent again from the payout's history, it is refused.
- `payouts payout abandon` gets the workflow's verdict: refused before the SLA (exit 4, one
  line), carried out after it (exit 0).
- A cancellation request (`temporal workflow cancel`, the UI's Request Cancellation) is refused
  and audited; the workflow keeps running and the payout is posted.
- A terminated workflow's payout is driven again (`payouts payout start-pending`) by state and
  evidence: never a second submission; a reset one goes on by evidence and pays once.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from lockservice.sdk import LockClient
from stack.embedded.temporal import temporal_binary
from tests.credentials import OPERATOR, token, token_file
from tests.workflows.integration import ids, record, start
from tests.workflows.system import (
    System,
    audit_rows,
    create_payout,
    fund,
    lock_token,
    signed_command,
    wait_for,
)
from workflows.payout import PayoutWorkflow

RULES = [{"reference_prefix": "amb-", "action": "ambiguous"}]
Handle = WorkflowHandle[PayoutWorkflow, m.PayoutStatus]
PAYOUTS = Path(sys.executable).parent / "payouts"  # the console script, as installed


#: The test's own acquires of an ambiguous payout's account wait for it: the workflow gives the
#: lock back when it leaves its critical section for the lookups, and on a loaded machine that
#: release can still be in flight when the test asks (a failure detector's bound, no timing).
_FREE_WITHIN_S = 60.0


@pytest.fixture
def lagging_rail(system: System) -> Iterator[None]:
    """The rail's lookups lag far behind: an ambiguous payout stays RAIL_AMBIGUOUS until the
    test lets the rail answer (`system.stub_set(visibility_delay_s=0)`)."""
    system.stub_set(visibility_delay_s=3600)
    yield
    system.stub_set(visibility_delay_s=0)


async def _ambiguous(
    temporal_env: WorkflowEnvironment, system: System, queue: str, **kw: float
) -> tuple[str, str, Handle]:
    payout_id, account_id = ids("amb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 700)
    handle = await start(temporal_env.client, queue, payout_id, account_id, **kw)
    await _until(handle, lambda s: s.state == "RAIL_AMBIGUOUS")
    return payout_id, account_id, handle


async def _until(handle: Handle, pred: object, timeout_s: float = 60.0) -> m.PayoutStatus:
    last: list[m.PayoutStatus] = []

    async def reached() -> bool:
        last[:] = [await handle.query(PayoutWorkflow.status)]
        return bool(pred(last[0]))  # type: ignore[operator]

    await wait_for(reached, timeout_s=timeout_s)
    return last[0]


async def _temporal(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `temporal` CLI, as an operator (or anyone who can reach Temporal) runs it. In a
    thread: the in-process workers answer on this test's event loop."""
    argv = [temporal_binary(), *args, "--address", address]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
    )


async def _payouts(system: System, address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `payouts` console script with the operator's token (in a thread, as above)."""
    env = {
        **os.environ,
        "PAYOUTS_OPERATOR_TOKEN_FILE": token_file(OPERATOR),
        "TEMPORAL_ADDRESS": address,
        "LOCK_URL": system.lock_url,
    }
    return await asyncio.to_thread(
        subprocess.run,
        [str(PAYOUTS), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


async def _timer_summaries(address: str, workflow_id: str) -> list[str]:
    """The summary of every timer in the workflow's history, as `temporal workflow show` gives
    it (the history the UI's Event History and Timeline render): each TimerStarted event's
    user metadata, its payload decoded."""
    shown = await _temporal(address, "workflow", "show", "--workflow-id", workflow_id, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    summaries = []
    for event in json.loads(shown.stdout)["events"]:
        if event.get("eventType") != "EVENT_TYPE_TIMER_STARTED":
            continue
        summary = event.get("userMetadata", {}).get("summary", {})
        summaries.append(json.loads(base64.b64decode(summary["data"])) if summary else "")
    return summaries


def _address(temporal_env: WorkflowEnvironment) -> str:
    return temporal_env.client.service_client.config.target_host


async def _rows(system: System, payout_id: str, action: str) -> list[str]:
    return [str(r["details"]) for r in await audit_rows(system.database_url, payout_id, action)]


async def test_evidence_outranks_an_abandon(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """A lookup finds the payout settled while another holder blocks the account's lock: the
    status shows the known resolution and the lookups; an abandon then (Update, and signal) is
    refused naming the evidence, audited for the signal; once the lock is free the payout is
    POSTED, paid once, and never ABANDONED."""
    address = _address(temporal_env)
    payout_id, account_id, handle = await _ambiguous(
        temporal_env, system, workers, resolution_sla_s=0.5
    )
    await _until(handle, lambda s: s.escalated)
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        blocker = await locks.acquire(f"payout:{account_id}", wait_s=_FREE_WITHIN_S)
        system.stub_set(visibility_delay_s=0)  # the rail now shows it settled
        status = await _until(handle, lambda s: s.resolution == "settled")
        assert status.state == "RAIL_AMBIGUOUS" and status.lookups >= 1
        assert status.evidence.startswith("lookup") and status.evidence.endswith("settled")
        assert status.last_lookup is not None and status.last_lookup.status == "settled"

        cli = await _payouts(
            system, address, "payout", "abandon", payout_id, "--reason", "ticket 9"
        )
        assert cli.returncode == 4, cli
        (line,) = cli.stderr.strip().splitlines()
        assert "refused" in line and "rail's evidence" in line and "settled" in line
        await handle.signal("abandon", signed_command(system, "abandon", payout_id, "ticket 9"))
        await _until(handle, lambda s: any(c.status == "refused" for c in s.commands))
        # What the operator reads meanwhile, through the console script: the known but not yet
        # applied resolution, the lookups, and the refused commands with their verdicts.
        db = ("--database-url", system.database_url)
        shown = await _payouts(system, address, "payout", "status", payout_id, *db, "--json")
        assert shown.returncode == 0, shown
        report = json.loads(shown.stdout)
        assert report["database"]["state"] == "RAIL_AMBIGUOUS"
        assert report["workflow"]["resolution"] == "settled"
        assert report["workflow"]["lookups"] >= 1
        assert any(c["status"] == "refused" for c in report["workflow"]["commands"])
        text = await _payouts(system, address, "payout", "status", payout_id, *db)
        assert text.returncode == 0 and "settled" in text.stdout and "refused" in text.stdout, text
        await locks.release(blocker)
    result = await handle.result()
    await record(handle, "commands_evidence_outranks_abandon")
    assert result.state == "POSTED"
    assert len(system.movements(payout_id)) == 1
    assert await audit_rows(system.database_url, payout_id, "abandon") == []
    (refusal,) = await _rows(system, payout_id, "signal_rejected:abandon")
    assert "rail's evidence" in refusal


async def test_two_arguments_and_undecodable_payloads_never_wedge_a_payout(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """Sent with the real `temporal` CLI: a signal with two arguments and one whose encoding
    no converter knows are each refused and audited, and the workflow goes on looking the
    payout up (lookups keep growing), then posts it once the rail answers."""
    address = _address(temporal_env)
    payout_id, _, handle = await _ambiguous(temporal_env, system, workers)
    wid = ["workflow", "signal", "--workflow-id", f"payout-{payout_id}", "--name", "abandon"]
    command = '{"operator": "ana", "reason": "x"}'
    two = await _temporal(address, *wid, "--input", command, "--input", command)
    assert two.returncode == 0, two.stderr
    odd = await _temporal(address, *wid, "--input", command, "--input-meta", "encoding=binary/odd")
    assert odd.returncode == 0, odd.stderr

    async def both_audited() -> bool:
        return len(await _rows(system, payout_id, "signal_rejected:abandon")) == 2

    await wait_for(both_audited, timeout_s=60)
    whys = await _rows(system, payout_id, "signal_rejected:abandon")
    assert any("got 2 arguments" in w for w in whys), whys
    assert any("not decodable" in w and "binary/odd" in w for w in whys), whys
    before = (await handle.query(PayoutWorkflow.status)).lookups
    await _until(handle, lambda s: s.lookups >= before + 3)  # not wedged: it goes on
    system.stub_set(visibility_delay_s=0)
    result = await handle.result()
    await record(handle, "commands_malformed_signals")
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1


async def test_a_forged_abandon_never_displaces_a_signed_one(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """The operator's signed abandon is accepted and waits for the account's lock; an
    uncredentialed one sent after it is refused on its own ("already pending"), audited as an
    unverified claim; the signed one is carried out, audited as the operator."""
    address = _address(temporal_env)
    payout_id, account_id, handle = await _ambiguous(
        temporal_env, system, workers, resolution_sla_s=0.5
    )
    await _until(handle, lambda s: s.escalated)
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        blocker = await locks.acquire(f"payout:{account_id}", wait_s=_FREE_WITHIN_S)
        await handle.signal("abandon", signed_command(system, "abandon", payout_id, "ticket 7"))
        await _until(handle, lambda s: any(c.status == "pending" for c in s.commands))
        forged = '{"operator": "x", "reason": "y"}'
        wid = ["workflow", "signal", "--workflow-id", f"payout-{payout_id}", "--name", "abandon"]
        assert (await _temporal(address, *wid, "--input", forged)).returncode == 0
        status = await _until(handle, lambda s: any(c.status == "refused" for c in s.commands))
        pending = [c for c in status.commands if c.status == "pending"]
        assert [c.actor for c in pending] == [OPERATOR]
        await locks.release(blocker)
    result = await handle.result()
    await record(handle, "commands_forged_abandon_refused_signed_carried_out")
    assert result.state == "ABANDONED"
    rows = await audit_rows(system.database_url, payout_id, "abandon")
    assert [r["actor"] for r in rows] == [OPERATOR]
    (refused,) = await audit_rows(system.database_url, payout_id, "signal_rejected:abandon")
    assert refused["actor"] == "unverified:x" and "already pending" in refused["details"]
    assert len(system.movements(payout_id)) == 1


async def test_the_abandons_last_lookup_finds_the_evidence_first(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """An abandon accepted while the rail could not tell waits for the account's lock; the rail
    settles meanwhile, and the abandon activity's own last lookup finds it: nothing is
    abandoned, the command ends refused naming the evidence (its one audit row, through
    settle_operator_command), and the payout is POSTED, paid once."""
    payout_id, account_id, handle = await _ambiguous(
        temporal_env, system, workers, resolution_sla_s=0.5
    )
    await _until(handle, lambda s: s.escalated)
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        blocker = await locks.acquire(f"payout:{account_id}", wait_s=_FREE_WITHIN_S)
        await handle.signal("abandon", signed_command(system, "abandon", payout_id, "ticket 11"))
        await _until(handle, lambda s: any(c.status == "pending" for c in s.commands))
        system.stub_set(visibility_delay_s=0)  # the rail now shows it settled
        await locks.release(blocker)
    result = await handle.result()
    await record(handle, "commands_abandon_outranked_by_last_lookup")
    assert result.state == "POSTED"
    (command,) = result.commands
    assert command.status == "refused" and "evidence came first" in command.why, command
    assert await audit_rows(system.database_url, payout_id, "abandon") == []
    assert len(system.movements(payout_id)) == 1


async def test_an_operator_assertion_is_single_use(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """A signed revoke is carried out; the very same command, copied from the payout's history
    and sent again (within its lifetime), is refused as `replayed`: the lock was revoked once,
    and the holder that took it next keeps its grant."""
    address = _address(temporal_env)
    payout_id, account_id, handle = await _ambiguous(temporal_env, system, workers)
    key = f"payout:{account_id}"
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        first = await locks.acquire(key, wait_s=_FREE_WITHIN_S)
        command = signed_command(system, "revoke", payout_id, "stuck holder", account_id)
        await handle.signal("revoke", command)
        await _until(handle, lambda s: any(c.status == "carried_out" for c in s.commands))
        second = await locks.acquire(key, wait_s=10)  # the account's next holder
        assert second.token > first.token
        copied = _signal_payload(await handle.fetch_history(), "revoke")
        wid = ["workflow", "signal", "--workflow-id", f"payout-{payout_id}", "--name", "revoke"]
        assert (await _temporal(address, *wid, "--input", copied)).returncode == 0
        status = await _until(handle, lambda s: any(c.status == "refused" for c in s.commands))
        (refused,) = [c for c in status.commands if c.status == "refused"]
        assert "already used" in refused.why
        assert lock_token(system, key) == second.token  # not revoked a second time
        await locks.release(second)
    revokes = await audit_rows(system.database_url, payout_id, "lock_revoke_requested")
    assert len(revokes) == 1 and json.loads(revokes[0]["details"])["revoked_token"] == first.token
    system.stub_set(visibility_delay_s=0)
    assert (await handle.result()).state == "POSTED"
    await record(handle, "commands_revoke_then_replay_refused")


def _signal_payload(history: object, name: str) -> str:
    """The JSON of the first `name` signal in a history, as anyone reading it could copy it."""
    for event in history.events:  # type: ignore[attr-defined]
        if event.HasField("workflow_execution_signaled_event_attributes"):
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name == name:
                return str(attrs.input.payloads[0].data.decode())
    raise AssertionError(f"no {name} signal in the history")


async def test_the_cli_gets_the_workflows_verdict(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """`payouts payout abandon` of a payout whose SLA cannot have escalated (4 hours): refused
    by the workflow's validator, one line, exit 4, nothing entered the history. Of one whose SLA
    escalated: carried out, exit 0, as the authenticated operator."""
    address = _address(temporal_env)
    early_id, _, early_handle = await _ambiguous(temporal_env, system, workers)
    early = await _payouts(system, address, "payout", "abandon", early_id, "--reason", "too early")
    assert early.returncode == 4, early
    (line,) = early.stderr.strip().splitlines()
    assert "refused" in line and "resolution SLA" in line
    assert not any(
        e.HasField("workflow_execution_update_accepted_event_attributes")
        for e in (await early_handle.fetch_history()).events
    )
    payout_id, _, handle = await _ambiguous(temporal_env, system, workers, resolution_sla_s=0.5)
    await _until(handle, lambda s: s.escalated)
    done = await _payouts(system, address, "payout", "abandon", payout_id, "--reason", "ticket 11")
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
    address = _address(temporal_env)
    payout_id, _, handle = await _ambiguous(temporal_env, system, workers)
    cancel = await _temporal(address, "workflow", "cancel", "--workflow-id", f"payout-{payout_id}")
    assert cancel.returncode == 0, cancel.stderr

    async def audited() -> bool:
        return bool(await _rows(system, payout_id, "signal_rejected:cancel"))

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
    address = _address(temporal_env)
    payout_id, _, _ = await _ambiguous(temporal_env, system, workers)
    wid = ["--workflow-id", f"payout-{payout_id}", "--reason", "operator mistake"]
    assert (await _temporal(address, "workflow", "terminate", *wid)).returncode == 0
    env_db = ["--database-url", system.database_url, "--task-queue", workers]
    env_db += ["--payout", payout_id]  # the session database holds other tests' payouts too
    out = await _payouts(system, address, "payout", "start-pending", *env_db)
    assert out.returncode == 0, out
    assert "started 1 workflow(s)" in out.stdout and "1 RAIL_AMBIGUOUS" in out.stdout
    again = temporal_env.client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")
    await _until(again, lambda s: s.lookups >= 1)
    system.stub_set(visibility_delay_s=0)
    result = await again.result()
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1
    second = await _payouts(system, address, "payout", "start-pending", *env_db)
    assert "started 0 workflow(s)" in second.stdout  # a completed one is never started again


async def test_a_reset_payout_goes_on_by_evidence_and_pays_once(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """`temporal workflow reset --type FirstWorkflowTask` (the UI's Reset) of a RAIL_AMBIGUOUS
    payout: the new run re-executes from its start, re-reads the payout under a fresh grant,
    finds it ambiguous and looks it up (never submits it again); posted once the rail answers."""
    address = _address(temporal_env)
    payout_id, _, handle = await _ambiguous(temporal_env, system, workers)
    first_token = (await handle.query(PayoutWorkflow.status)).token
    reset = await _temporal(
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
    status = await _until(latest, lambda s: s.lookups >= 1 and s.token > first_token)
    assert status.state == "RAIL_AMBIGUOUS"
    system.stub_set(visibility_delay_s=0)
    result = await latest.result()
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1
