"""A payout workflow outlives every outage (issue 12 item 3), on the real dev server with the real
components: the lock server, the rail stub and the rail proxy as processes, PostgreSQL, and
workers running the real activities.

Each test makes an outage last longer than the retry budget the workflow had before (four
attempts, about 0.5 + 1 + 2 + 4 s), checks that the workflow is still running, ends the outage,
and checks that the payout then completes with exactly one movement at the rail.
Set RECORD_HISTORIES=1 to (re)write the continue-as-new replay history.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from stack.embedded.shared import free_port
from tests.credentials import OPERATOR
from tests.workflows.system import (
    System,
    audit_rows,
    create_payout,
    failed_attempts,
    fund,
    in_process_workers,
    signed_command,
    wait_for,
)
from workflows.payout import PayoutWorkflow

HISTORIES = Path(__file__).parent / "histories"
#: The attempts and the time the bounded read policy allowed before issue 12.
OLD_ATTEMPTS = 4
OLD_BUDGET_S = 0.5 + 1 + 2 + 4
FAST = {
    "acquire_wait_s": 2.0,
    "base_backoff_s": 0.2,
    "max_backoff_s": 1.0,
    "lookup_interval_s": 0.3,
    "submit_deadline_s": 2.0,
    "holder_pickup_s": 3.0,
    "holder_heartbeat_timeout_s": 3.0,
    "read_retry_max_interval_s": 0.5,
}
RULES = [{"reference_prefix": "amb-", "action": "ambiguous"}]
Handle = WorkflowHandle[PayoutWorkflow, m.PayoutStatus]


async def ambiguous_payout(
    client: Client, system: System, queue: str, amount: int, **kw: Any
) -> tuple[str, Handle]:
    """Start a payout the rail records but answers ambiguously, its lookups lagging far behind
    (visibility delay), so that it stays RAIL_AMBIGUOUS until the test lets the rail answer."""
    suffix = uuid.uuid4().hex[:10]
    payout_id, account_id = f"amb-{suffix}", f"acct-{suffix}"
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, amount)
    inp = m.PayoutInput(payout_id=payout_id, account_id=account_id, **{**FAST, **kw})
    await client.start_workflow(PayoutWorkflow.run, inp, id=f"payout-{payout_id}", task_queue=queue)
    # A handle without a run id follows the workflow across continue-as-new.
    return payout_id, client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")


async def until_state(handle: Handle, state: str, timeout_s: float = 60) -> None:
    async def reached() -> bool:
        return (await handle.query(PayoutWorkflow.status)).state == state

    await wait_for(reached, timeout_s=timeout_s)


async def pending_attempts(handle: Handle, activity: str) -> int:
    """The attempt number Temporal reports for a pending activity of this type (0: none)."""
    desc = await handle.describe()
    return max(
        (
            p.attempt
            for p in desc.raw_description.pending_activities
            if p.activity_type.name == activity
        ),
        default=0,
    )


async def running(handle: Handle) -> bool:
    return (await handle.describe()).status == WorkflowExecutionStatus.RUNNING


async def test_revoke_during_a_lock_server_outage_is_carried_out_when_it_returns(
    temporal_env: WorkflowEnvironment, system: System
) -> None:
    """The lock server is down when an operator sends a revoke: the workflow does not fail, the
    revoke is retried past the old budget and carried out (audited) once the server is back,
    and the payout then completes, paid once."""
    client = temporal_env.client
    queue = f"payouts-{uuid.uuid4()}"
    system.stub_set(visibility_delay_s=3600)
    try:
        async with in_process_workers(client, system, queue, count=1):
            payout_id, handle = await ambiguous_payout(client, system, queue, 600)
            await until_state(handle, "RAIL_AMBIGUOUS")
            # The CLI obtains the assertion first (it cannot while the lock server is down); it
            # outlives the outage (5 minutes), and the lock server checks it on its return.
            account_id = "acct-" + payout_id.removeprefix("amb-")
            command = signed_command(
                system, "revoke", payout_id, "drill: lock server down", account_id
            )
            system.stop_service("lock")
            try:
                await handle.signal("revoke", command)

                async def retried_past_old_budget() -> bool:
                    return await failed_attempts(handle, m.CARRY_OUT_REVOKE) > OLD_ATTEMPTS

                await wait_for(retried_past_old_budget, timeout_s=90, every_s=0.5)
                assert await running(handle)
                assert (await handle.query(PayoutWorkflow.status)).pending_revokes == 1
            finally:
                system.start_service("lock")

            async def revoke_audited() -> bool:
                return bool(
                    await audit_rows(system.database_url, payout_id, "lock_revoke_requested")
                )

            await wait_for(revoke_audited, timeout_s=60, every_s=0.3)
            system.stub_set(visibility_delay_s=0)  # the rail's lookup now shows it settled
            result = await handle.result()
    finally:
        system.stub_set(visibility_delay_s=0)
    assert result.state == "POSTED"
    assert result.pending_revokes == 0 and result.rejected_signals == []
    rows = await audit_rows(system.database_url, payout_id, "lock_revoke_requested")
    assert [r["actor"] for r in rows] == [OPERATOR]
    assert len(system.movements(payout_id)) == 1


async def test_every_worker_down_longer_than_the_old_budget_only_delays_the_payout(
    temporal_env: WorkflowEnvironment, system: System
) -> None:
    """RAIL_AMBIGUOUS, then no worker at all for longer than the old budget, then workers that are
    up but reach neither the database nor the rail proxy, so the SLA escalation fails attempt
    after attempt: the workflow stays running throughout; healthy workers finish it (escalation
    audited once, lookups settle it, POSTED, paid once)."""
    client = temporal_env.client
    queue = f"payouts-{uuid.uuid4()}"
    system.stub_set(visibility_delay_s=3600)
    try:
        async with in_process_workers(client, system, queue, count=2):
            payout_id, handle = await ambiguous_payout(
                client, system, queue, 800, resolution_sla_s=12.0
            )
            await until_state(handle, "RAIL_AMBIGUOUS")
        stopped_at = time.monotonic()

        # No worker: the next lookup (or the workflow task after its timer) waits in its queue.
        async def waited_past_old_budget() -> bool:
            desc = await handle.describe()
            waiting = bool(
                desc.raw_description.pending_activities
            ) or desc.raw_description.HasField("pending_workflow_task")
            return waiting and time.monotonic() - stopped_at > OLD_BUDGET_S

        await wait_for(waited_past_old_budget, timeout_s=60, every_s=0.5)
        assert await running(handle)

        dead_db = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"
        dead_proxy = f"http://127.0.0.1:{free_port()}"
        async with in_process_workers(
            client, system, queue, count=1, database_url=dead_db, proxy_url=dead_proxy
        ):

            async def escalation_failing_past_old_budget() -> bool:
                return await pending_attempts(handle, m.ESCALATE_AMBIGUOUS) > OLD_ATTEMPTS

            await wait_for(escalation_failing_past_old_budget, timeout_s=120, every_s=0.5)
            assert await running(handle)

        async with in_process_workers(client, system, queue, count=1):

            async def escalated() -> bool:
                return bool(await audit_rows(system.database_url, payout_id, "ambiguity_escalated"))

            await wait_for(escalated, timeout_s=60, every_s=0.3)
            system.stub_set(visibility_delay_s=0)
            result = await handle.result()
    finally:
        system.stub_set(visibility_delay_s=0)
    assert result.state == "POSTED" and result.escalated
    assert len(await audit_rows(system.database_url, payout_id, "ambiguity_escalated")) == 1
    assert len(system.movements(payout_id)) == 1


async def test_ambiguous_payout_continues_as_new_and_is_then_abandoned(
    temporal_env: WorkflowEnvironment, system: System
) -> None:
    """An ambiguous payout loops past max_lookups_per_run: the workflow continues as new (more
    than once), the escalation survives each run and happens once, and an operator's abandon
    sent to the workflow id ends it ABANDONED, audited with the operator as actor."""
    client = temporal_env.client
    queue = f"payouts-{uuid.uuid4()}"
    system.stub_set(visibility_delay_s=3600)
    try:
        async with in_process_workers(client, system, queue, count=1):
            payout_id, handle = await ambiguous_payout(
                client, system, queue, 700, resolution_sla_s=1.0, max_lookups_per_run=3
            )
            first_run = (await handle.describe()).run_id

            async def escalated_in_a_later_run() -> bool:
                status = await handle.query(PayoutWorkflow.status)
                return status.escalated and status.runs >= 3

            await wait_for(escalated_in_a_later_run, timeout_s=90)
            await handle.signal(
                "abandon",
                signed_command(system, "abandon", payout_id, "rail ticket 43: no record"),
            )
            result = await handle.result()
            first = client.get_workflow_handle(handle.id, run_id=first_run)
            if os.environ.get("RECORD_HISTORIES"):
                history = await first.fetch_history()
                (HISTORIES / "continued_as_new.json").write_text(history.to_json())
            first_status = (await first.describe()).status
    finally:
        system.stub_set(visibility_delay_s=0)
    assert first_status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert (await handle.describe()).run_id != first_run
    assert result.state == "ABANDONED" and result.escalated and result.runs >= 3
    conn = await asyncpg.connect(system.database_url)
    try:
        actor = await conn.fetchval(
            "SELECT actor FROM paydb.audit_log WHERE payout_id = $1 AND to_state = 'ABANDONED'",
            payout_id,
        )
    finally:
        await conn.close()
    assert actor == OPERATOR
    assert len(await audit_rows(system.database_url, payout_id, "ambiguity_escalated")) == 1
    assert len(system.movements(payout_id)) == 1
