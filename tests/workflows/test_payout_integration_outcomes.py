"""PayoutWorkflow end to end against the real components (Temporal dev server, PostgreSQL, the
lock server, the rail proxy and the rail stub, with the real activities), the rail stub's
movement log checked every time: each answer of the rail ends in its outcome, from a payout
posted once in both shapes through a decline, insufficient funds, an ambiguous answer resolved
by lookup, a stall proved absent, to a submit that reached nothing submitted again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from stack.embedded.temporal import temporal_binary
from tests.workflows.integration import RULES, balance_and_breaks, ids, record, start
from tests.workflows.system import System, create_payout, fund, lock_token, wait_for
from workflows.payout import PayoutWorkflow

__all__ = ["RULES"]  # the rail stub's, for the `system` fixture (tests/workflows/conftest.py)
WORKERS = 2  # the `workers` fixture's (tests/workflows/conftest.py)


@pytest.mark.parametrize("two_task", [True, False], ids=["two_task", "three_task"])
async def test_happy_path_pays_once_and_posts(
    temporal_env: WorkflowEnvironment, system: System, workers: str, two_task: bool
) -> None:
    """UC-01: one rail movement, POSTED, the account debited once, the ledger balanced; in both
    shapes of the A/B switch (`PayoutInput.two_task`)."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 2_500)
    handle = await start(temporal_env.client, workers, payout_id, account_id, two_task=two_task)
    result = await handle.result()
    await record(handle, "two_task_happy_path" if two_task else "three_task_happy_path")
    assert result.state == "POSTED"
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (7_500, 0)
    # Two-task: ONE activity acquired, then did claim, submit, post and the release: 2 workflow
    # tasks. Three-task: the acquire, then execute_payout on the holder's queue: 3 tasks. What
    # the merged step did is in its result for operators.
    history = await handle.fetch_history()
    done = [
        e.activity_task_completed_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    ]
    assert len(done) == (1 if two_task else 2)  # no separate step or release
    executed = json.loads(done[-1].result.payloads[0].data)
    executed = executed["view"] if two_task else executed
    assert executed["steps"] == ["claim", "submit", "post", "release"] and executed["released"]
    tasks = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    completed = [e.event_id for e in history.events if e.event_type == tasks]
    assert len(completed) == (2 if two_task else 3)
    # Search attributes are upserted by the first and the last task only (one visibility write
    # each; the middle task upserts nothing). Started without search attributes, the first task
    # upserted all three; the last only the state.
    upserts = [
        e.upsert_workflow_search_attributes_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert {u.workflow_task_completed_event_id for u in upserts} == {completed[0], completed[-1]}
    last = [u for u in upserts if u.workflow_task_completed_event_id == completed[-1]]
    assert [set(u.search_attributes.indexed_fields) for u in last] == [{"PayoutState"}]
    # The grant was released by the activity: the account's lock is free at once.
    assert lock_token(system, f"payout:{account_id}") is None
    # Findable by state with the real `temporal` CLI (the search attributes it upserted).
    address = temporal_env.client.service_client.config.target_host
    query = f'PayoutState="POSTED" AND PayoutAccountId="{account_id}"'

    async def listed() -> bool:
        found = await asyncio.to_thread(temporal_list, address, query)
        return [w["execution"]["workflowId"] for w in found] == [f"payout-{payout_id}"]

    await wait_for(listed, timeout_s=30)


def temporal_list(address: str, query: str) -> list[dict[str, Any]]:
    """`temporal workflow list --query ... -o json`: the real CLI, as an operator runs it."""
    argv = [temporal_binary(), "workflow", "list", "--address", address, "--query", query]
    done = subprocess.run(
        [*argv, "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return rows


async def test_decline_fails_without_ledger(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-01 (c): a business decline ends FAILED, the balance untouched."""
    payout_id, account_id = ids("dcl-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 1_000)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "decline")
    assert result.state == "FAILED"
    assert await balance_and_breaks(system.database_url, account_id) == (10_000, 0)
    assert len(system.movements(payout_id)) == 1  # the rail saw it once and declined it


async def test_insufficient_funds_never_reaches_the_rail(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-01 (b): insufficient funds -> FAILED at claim, no rail movement."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 100)
    await create_payout(system.database_url, payout_id, account_id, 1_000)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "insufficient_funds")
    assert result.state == "FAILED"
    assert system.movements(payout_id) == []


async def test_ambiguous_is_resolved_by_lookup(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-05: the rail recorded it but answered with an error; a lookup finds it settled, it is
    posted, and it was never submitted again."""
    payout_id, account_id = ids("amb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 3_000)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "ambiguous_resolved")
    assert result.state == "POSTED"
    assert result.attempt is not None and result.attempt.outcome == "UNKNOWN"
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (7_000, 0)


async def test_timeout_before_handoff_is_resolved_absent(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """A stall before the rail recorded anything is UNKNOWN to the proxy; the lookup, complete
    past the attempt's deadline, proves it absent, and the payout FAILS without a resubmit."""
    payout_id, account_id = ids("tb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 500)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "timeout_before_absent")
    assert result.state == "FAILED"
    assert system.movements(payout_id) == []
    assert await balance_and_breaks(system.database_url, account_id) == (10_000, 0)


async def test_a_submit_that_reached_nothing_is_submitted_under_the_next_grant(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """The rail is down (nothing reaches it): the merged step's submit is NOT_SUBMITTED and the
    payout stays CLAIMED; after a backoff the next grant reads the proxy's attempt record, which
    proves nothing was handed off, and submits once more (`submit_to_rail`): POSTED, one
    movement. Last in the module: the rail's outage also opens the proxy's circuit breaker."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 400)
    system.stub_set(outage=True)
    try:
        handle = await start(temporal_env.client, workers, payout_id, account_id)

        async def not_submitted() -> bool:
            status = await handle.query(PayoutWorkflow.status)
            return status.last_error.startswith("not submitted")

        await wait_for(not_submitted, timeout_s=60)
    finally:
        system.stub_set(outage=False)
    result = await handle.result()
    await record(handle, "not_submitted_then_submitted")
    assert result.state == "POSTED"
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (9_600, 0)
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert m.SUBMIT_TO_RAIL in scheduled
