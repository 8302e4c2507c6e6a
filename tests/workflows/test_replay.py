"""Replay tests: histories recorded from real runs of the current PayoutWorkflow (with
RECORD_HISTORIES=1, by the tests named in REQUIRED) must replay against it without a
non-determinism error; a deliberately non-deterministic change must be caught.

The corpus is exactly REQUIRED (no stale file) and holds no patch marker: nothing is deployed
yet, so every patch was retired (issue 30). From the first release on, a change of the commands
the workflow issues goes behind `workflow.patched` and adds a history per new branch, and the
old histories stay until the patch is removed (docs/workflow.md, "Changing the workflow"): then
PATCHES below names the patch ids the corpus may hold, deliberately.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from activities import models as m
from workflows.payout import PayoutWorkflow

HISTORIES = Path(__file__).parent / "histories"
#: History name -> the test that records it (RECORD_HISTORIES=1), and the branch it covers.
REQUIRED = {
    # test_payout_integration_*.py, both shapes of the A/B switch `PayoutInput.two_task`.
    "two_task_happy_path": "acquire_and_execute: claim, submit, post, release in one activity",
    "three_task_happy_path": "acquire_lock, then execute_payout on the holder's queue",
    "two_task_worker_killed_recovered": "holder killed in acquire_and_execute after the submit; "
    "the next grant recovers from the proxy's attempt record",
    "three_task_worker_killed_recovered": "holder killed in execute_payout after the submit: "
    "the step times out, its release runs beside the next acquire, recovery by the attempt",
    "decline": "the rail declines: FAILED, no ledger",
    "insufficient_funds": "FAILED at the claim, the rail never reached",
    "ambiguous_resolved": "RAIL_AMBIGUOUS, a lookup finds it settled: resolve_ambiguous, post",
    "timeout_before_absent": "RAIL_AMBIGUOUS, lookups prove it absent: FAILED",
    "ambiguous_abandoned": "escalation past the SLA, an abandon signal carried out",
    "revoke": "a revoke signal carried out by the lock service; re-acquired, recovered",
    "not_submitted_then_submitted": "the rail down: NOT_SUBMITTED, then the next grant's "
    "submit_to_rail, as the attempt record proves nothing was handed off",
    # test_payout_resilience.py: the first run of an ambiguous payout, ending in ContinueAsNew.
    "continued_as_new": "continue-as-new after max_lookups_per_run, state carried",
    # test_operator_assertions.py: refused operator assertions, then a valid one carried out.
    "revoke_assertions_refused_then_valid": "revokes refused by the lock server, then one",
    "abandon_assertions_refused_then_valid": "abandons refused by the payment store, then one",
    # test_operator_commands_*.py: the dynamic signal handler, Updates, the store's verdicts.
    "commands_evidence_outranks_abandon": "the abandon's last lookup finds the rail's evidence",
    "commands_malformed_signals": "malformed signals refused and audited",
    "commands_forged_abandon_refused_signed_carried_out": "forged abandon refused, signed one",
    "commands_abandon_outranked_by_last_lookup": "an accepted abandon refused: the abandon's "
    "last lookup finds the rail's evidence (settle_operator_command)",
    "commands_revoke_then_replay_refused": "a revoke carried out, its replayed assertion refused",
    "commands_update_abandon_carried_out": "an abandon Update carried out",
    "commands_cancel_refused": "a cancellation request refused; the payout goes on",
    # test_temporal_restart.py: Temporal down past the acquire's start-to-close.
    "temporal_restart_acquire_timed_out": "the acquire timed out, backoff, re-acquired",
}
#: Patch ids the corpus may hold (docs/workflow.md, "Changing the workflow"): none today.
PATCHES: frozenset[str] = frozenset()


def events(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
    return found


def load(name: str) -> WorkflowHistory:
    text = (HISTORIES / f"{name}.json").read_text()
    return WorkflowHistory.from_json(f"replay-{name}", text)


def scheduled(name: str) -> list[str]:
    return [
        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in events(name)
        if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
    ]


def test_the_corpus_is_exactly_the_required_histories() -> None:
    """Every required history is committed, and nothing else: a stale history (of a branch the
    workflow no longer has) is deleted, not kept replaying by accident."""
    assert {p.stem for p in HISTORIES.iterdir()} == set(REQUIRED)
    assert all(p.suffix == ".json" for p in HISTORIES.iterdir())


@pytest.mark.parametrize("name", sorted(REQUIRED))
async def test_recorded_history_replays(name: str) -> None:
    """The current workflow code makes the same decisions as the code that recorded the run."""
    await Replayer(workflows=[PayoutWorkflow]).replay_workflow(load(name))


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_no_history_holds_a_patch_marker(name: str) -> None:
    """No patch marker (`core_patch`, `__temporal_patch`, "patched") and no TemporalChangeVersion
    upsert, unless its patch id is in PATCHES: a future patch is added deliberately."""
    for e in events(name):
        if e["eventType"] == "EVENT_TYPE_MARKER_RECORDED":
            attrs = e["markerRecordedEventAttributes"]
            marker = attrs.get("markerName", "")
            assert "patch" not in marker.lower(), f"{name}: marker {marker}"
            data = attrs.get("details", {}).get("patch-data", {}).get("payloads", [])
            ids = {json.loads(base64.b64decode(d["data"]))["id"] for d in data}
            assert ids <= PATCHES, f"{name}: patch ids {ids}"
        if e["eventType"] == "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            fields = e["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"]
            assert "TemporalChangeVersion" not in fields.get("indexedFields", {}), name
    assert "__temporal_patch" not in (HISTORIES / f"{name}.json").read_text()


@workflow.defn(name="PayoutWorkflow")
class ReorderedPayoutWorkflow(PayoutWorkflow):
    """A deliberately non-deterministic change: a timer before the first step."""

    @workflow.run
    async def run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(inp)


@pytest.mark.parametrize("name", ["two_task_happy_path", "three_task_happy_path"])
async def test_a_non_deterministic_change_is_caught(name: str) -> None:
    """Replaying a real history against a changed command sequence fails (negative control)."""
    with pytest.raises(workflow.NondeterminismError):
        await Replayer(workflows=[ReorderedPayoutWorkflow]).replay_workflow(load(name))


def test_both_shapes_were_recorded_from_real_runs() -> None:
    """The two shapes of the A/B switch: one activity (two tasks), or the acquire and the merged
    holder step, each scheduled with ONE attempt (they may reach the submit)."""
    assert scheduled("two_task_happy_path") == [m.ACQUIRE_AND_EXECUTE]
    assert scheduled("three_task_happy_path") == [m.ACQUIRE_LOCK, m.EXECUTE_PAYOUT]
    attempts = [
        e["activityTaskScheduledEventAttributes"]["retryPolicy"]["maximumAttempts"]
        for name in ("two_task_happy_path", "three_task_happy_path")
        for e in events(name)
        if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
        and e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        in (m.ACQUIRE_AND_EXECUTE, m.EXECUTE_PAYOUT)
    ]
    assert attempts == [1, 1]


def test_the_corpus_schedules_every_activity_the_workflow_can() -> None:
    """Every activity PayoutWorkflow (and its operator desk) schedules appears in some history,
    so each branch that issues it is replayed, and no history schedules one it no longer can."""
    everything = {name for h in REQUIRED for name in scheduled(h)}
    activities = {
        m.ACQUIRE_AND_EXECUTE,
        m.ACQUIRE_LOCK,
        m.EXECUTE_PAYOUT,
        m.SUBMIT_TO_RAIL,
        m.RECOVER_FROM_ATTEMPT,
        m.POST_TO_LEDGER,
        m.RELEASE_LOCK,
        m.LOOKUP_RAIL,
        m.RESOLVE_AMBIGUOUS,
        m.ABANDON_PAYOUT,
        m.ESCALATE_AMBIGUOUS,
        m.RECORD_SIGNAL_REJECTED,
        m.ACCEPT_OPERATOR_COMMAND,
        m.SETTLE_OPERATOR_COMMAND,
        m.CARRY_OUT_REVOKE,
    }
    assert everything == activities


def test_the_continue_as_new_history_hands_its_state_to_the_next_run() -> None:
    """The corpus' continue-as-new history ends in ContinueAsNew, and the next run's input
    carries the ambiguous payout's state and its escalation."""
    found = events("continued_as_new")
    assert found[-1]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW"
    attrs = found[-1]["workflowExecutionContinuedAsNewEventAttributes"]
    carried = json.loads(base64.b64decode(attrs["input"]["payloads"][0]["data"]))["carried"]
    assert carried["state"] == "RAIL_AMBIGUOUS" and carried["escalated"] is True
    assert carried["ambiguous_since"] and carried["runs"] == 1


def test_the_timed_out_holder_is_released_beside_the_next_acquire() -> None:
    """After the killed holder's step timed out (three-task shape), the next acquire and the
    old grant's release are scheduled by the same workflow task."""
    found = events("three_task_worker_killed_recovered")
    first = next(
        i for i, e in enumerate(found) if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT"
    )
    after = [
        (
            e["activityTaskScheduledEventAttributes"]["activityType"]["name"],
            e["activityTaskScheduledEventAttributes"]["workflowTaskCompletedEventId"],
        )
        for e in found[first:]
        if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
    ][:2]
    assert [name for name, _ in after] == [m.ACQUIRE_LOCK, m.RELEASE_LOCK]
    assert after[0][1] == after[1][1]
