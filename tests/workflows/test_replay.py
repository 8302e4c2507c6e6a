"""Replay tests: histories recorded from real runs (tests/workflows/test_payout_integration.py
and, for `continued_as_new`, test_payout_resilience.py; for the operator-assertion ones,
test_operator_assertions.py; for the operator-command ones (issue 24), test_operator_commands.py;
for the Temporal restart one, test_temporal_restart.py; with
RECORD_HISTORIES=1) must replay against the current PayoutWorkflow without a
non-determinism error; a deliberately non-deterministic change must be caught."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from activities import models as m
from workflows.payout import (
    PATCH_CONTINUE_AS_NEW,
    PATCH_MERGED_HOLDER,
    PATCH_RELEASE_BESIDE_REACQUIRE,
    PayoutWorkflow,
)

HISTORIES = Path(__file__).parent / "histories"
REQUIRED = {
    "happy_path",
    "decline",
    "ambiguous_resolved",
    "ambiguous_abandoned",
    "worker_killed_recovered",
    # The same scenario recorded after the release-beside-reacquire patch (issue 16, takeover):
    # the killed holder's release is scheduled beside the next acquire, not before it.
    "worker_killed_release_beside_reacquire",
    "revoke",
    "continued_as_new",  # the first run of an ambiguous payout, ending in ContinueAsNew
    # test_operator_assertions.py: signals carrying refused operator assertions (recorded
    # rejections; the abandon refusal's patch marker), then a valid one carried out.
    "revoke_assertions_refused_then_valid",
    "abandon_assertions_refused_then_valid",
    # test_payout_integration.py since patch merged-holder-steps: the one merged holder step,
    # and the holder killed inside it after the submit, recovered by the attempt record.
    "merged_happy_path",
    "merged_worker_killed_recovered",
    # test_temporal_restart.py: Temporal restarted while a grant was in flight and down past
    # the acquire's start-to-close; the acquire timed out, the workflow backed off and paid
    # under a re-acquired grant.
    "temporal_restart_acquire_timed_out",
    # Since patch lean-visibility: merged-holder-steps decided in the first workflow task, the
    # search attributes upserted only when they change (the middle task upserts nothing).
    "lean_happy_path",
    # test_operator_commands.py since patch operator-commands (issue 24): the dynamic signal
    # handler, Updates, the store's verdicts, evidence over an abandon, a refused cancellation.
    "commands_evidence_outranks_abandon",
    "commands_malformed_signals",
    "commands_forged_abandon_refused_signed_carried_out",
    "commands_revoke_then_replay_refused",
    "commands_update_abandon_carried_out",
    "commands_cancel_refused",
    # Since patch acquire-and-execute (issue 29): the two-task happy path, and the holder killed
    # inside it after the submit, recovered by the attempt record under the next grant.
    "two_task_happy_path",
    "two_task_worker_killed_recovered",
}


def load(name: str) -> WorkflowHistory:
    text = (HISTORIES / f"{name}.json").read_text()
    return WorkflowHistory.from_json(f"replay-{name}", text)


def test_every_required_history_is_committed() -> None:
    """The replay corpus covers the scenarios the issue names."""
    assert {p.stem for p in HISTORIES.glob("*.json")} >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
async def test_recorded_history_replays(name: str) -> None:
    """The current workflow code makes the same decisions as the code that recorded the run."""
    await Replayer(workflows=[PayoutWorkflow]).replay_workflow(load(name))


@workflow.defn(name="PayoutWorkflow")
class ReorderedPayoutWorkflow(PayoutWorkflow):
    """A deliberately non-deterministic change: a timer before the first step."""

    @workflow.run
    async def run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(inp)


async def test_a_non_deterministic_change_is_caught() -> None:
    """Replaying a real history against a changed command sequence fails (negative control)."""
    with pytest.raises(workflow.NondeterminismError):
        await Replayer(workflows=[ReorderedPayoutWorkflow]).replay_workflow(load("happy_path"))


def test_histories_were_recorded_from_real_runs() -> None:
    """Each history ran real activities (not mocks): it contains the UC-01 activity names."""
    names = set()
    for event in json.loads((HISTORIES / "happy_path.json").read_text())["events"]:
        attrs = event.get("activityTaskScheduledEventAttributes")
        if attrs:
            names.add(attrs["activityType"]["name"])
    assert {
        m.ACQUIRE_LOCK,
        m.REREAD_AND_CLAIM,
        m.SUBMIT_TO_RAIL,
        m.POST_TO_LEDGER,
        m.RELEASE_LOCK,
    } <= names


def test_the_continue_as_new_history_hands_its_state_to_the_next_run() -> None:
    """The corpus' continue-as-new history ends in ContinueAsNew behind its patch marker, and
    the next run's input carries the ambiguous payout's state and its escalation."""
    events = json.loads((HISTORIES / "continued_as_new.json").read_text())["events"]
    assert events[-1]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW"
    markers = [
        e["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"][0]["data"]
        for e in events
        if e["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
    ]
    assert [json.loads(base64.b64decode(d))["id"] for d in markers] == [PATCH_CONTINUE_AS_NEW]
    attrs = events[-1]["workflowExecutionContinuedAsNewEventAttributes"]
    carried = json.loads(base64.b64decode(attrs["input"]["payloads"][0]["data"]))["carried"]
    assert carried["state"] == "RAIL_AMBIGUOUS" and carried["escalated"] is True
    assert carried["ambiguous_since"] and carried["runs"] == 1


def _patch_ids(events: list[dict[str, object]]) -> list[str]:
    return [
        json.loads(
            base64.b64decode(
                e["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"][0]["data"]
            )
        )["id"]  # type: ignore[index]
        for e in events
        if e["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
    ]


def test_the_release_beside_reacquire_history_schedules_both_in_one_task() -> None:
    """The corpus covers the new path: after the killed holder's step timed out, the next
    acquire and the old grant's release are scheduled by the same workflow task, and the
    history without the patch (worker_killed_recovered) releases first."""

    def after_timeout(name: str) -> list[str]:
        events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
        first = next(
            i
            for i, e in enumerate(events)
            if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT"
        )
        return [
            e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
            for e in events[first:]
            if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"
        ][:2]

    new = json.loads((HISTORIES / "worker_killed_release_beside_reacquire.json").read_text())
    assert PATCH_RELEASE_BESIDE_REACQUIRE in _patch_ids(new["events"])
    assert after_timeout("worker_killed_release_beside_reacquire") == [
        m.ACQUIRE_LOCK,
        m.RELEASE_LOCK,
    ]
    assert after_timeout("worker_killed_recovered")[0] == m.RELEASE_LOCK


def test_the_merged_histories_run_the_merged_holder_step_behind_its_patch() -> None:
    """The merged-shape histories schedule execute_payout (one attempt) behind the patch marker,
    and no separate reread_and_claim; the pre-merge happy path has neither."""

    def shape(name: str) -> tuple[list[str], list[str], list[int]]:
        events = json.loads((HISTORIES / f"{name}.json").read_text())["events"]
        names, attempts = [], []
        for e in events:
            attrs = e.get("activityTaskScheduledEventAttributes")
            if attrs:
                names.append(attrs["activityType"]["name"])
                if attrs["activityType"]["name"] == m.EXECUTE_PAYOUT:
                    attempts.append(attrs["retryPolicy"]["maximumAttempts"])
        patches = [
            json.loads(base64.b64decode(d))["id"]
            for e in events
            if e["eventType"] == "EVENT_TYPE_MARKER_RECORDED"
            for d in [
                e["markerRecordedEventAttributes"]["details"]["patch-data"]["payloads"][0]["data"]
            ]
        ]
        return names, patches, attempts

    names, patches, attempts = shape("merged_happy_path")
    assert names == [m.ACQUIRE_LOCK, m.EXECUTE_PAYOUT] and attempts == [1]
    assert PATCH_MERGED_HOLDER in patches
    names, patches, _ = shape("merged_worker_killed_recovered")
    assert m.EXECUTE_PAYOUT in names and m.SUBMIT_TO_RAIL not in names
    names, patches, _ = shape("happy_path")
    assert m.EXECUTE_PAYOUT not in names and PATCH_MERGED_HOLDER not in patches
