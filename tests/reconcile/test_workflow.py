"""ReconcileWorkflow on the real Temporal dev server with the real activity, database, proxy and
stub; and the Schedule `reconcile-hourly` created by the CLI's code path, fired by trigger()."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta

from temporalio.client import ScheduleIntervalSpec
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.models import PayoutInput
from activities.reconcile import ReconcileActivities
from activities.reconcile_models import ReconcileInput, ReconcileReport
from activities.redrive import RedriveActivities, start_payout
from reconcile.rules import CLASSES
from tests.reconcile.conftest import World
from workflows.reconcile import ReconcileWorkflow
from workflows.reconcile_schedule import SCHEDULE_ID, ensure_schedule


@asynccontextmanager
async def worker(env: WorkflowEnvironment, w: World) -> AsyncIterator[str]:
    queue = f"reconcile-{uuid.uuid4()}"
    acts = ReconcileActivities(w.pool, w.movements, sla=timedelta(hours=4))
    redrive = RedriveActivities(w.pool, env.client, queue)
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[ReconcileWorkflow],
        activities=[acts.reconcile, redrive.redrive_stranded_payouts],
    ):
        yield queue


async def test_workflow_returns_the_report(temporal_env: WorkflowEnvironment, world: World) -> None:
    """An explicit closed window is reconciled by the activity and the report comes back."""
    start = await world.db_now() - timedelta(milliseconds=1)
    await world.pay(1000)
    movement_id = await world.stub_payment("stray-wf")
    end = await world.db_now()
    inp = ReconcileInput(window_s=(end - start).total_seconds(), window_end=end.isoformat())
    async with worker(temporal_env, world) as queue:
        report = await temporal_env.client.execute_workflow(
            ReconcileWorkflow.run, inp, id=f"reconcile-test-{uuid.uuid4()}", task_queue=queue
        )
    assert isinstance(report, ReconcileReport)
    assert set(report.counts) == set(CLASSES)
    assert report.counts["movement_without_attempt"] == 1
    assert report.samples["movement_without_attempt"] == [movement_id]
    assert report.checked_payouts == 1 and not report.ok
    assert report.window_end == end.isoformat()


async def test_schedule_triggers_the_workflow(
    temporal_env: WorkflowEnvironment, world: World
) -> None:
    """The Schedule made by `payouts reconcile schedule`'s code path starts ReconcileWorkflow,
    which reconciles the window ending at the action time; re-running it updates in place."""
    await world.pay(1000)
    movement_id = await world.stub_payment("stray-schedule")
    # Temporal records the action time in whole seconds: let the clock pass the second in which
    # the stray movement was recorded, so the window that closes at the action time contains it.
    recorded_second = (await world.db_now()).replace(microsecond=0)
    while (await world.db_now()).replace(microsecond=0) <= recorded_second:
        await asyncio.sleep(0.05)
    client = temporal_env.client
    async with worker(temporal_env, world) as queue:
        handle = await ensure_schedule(client, every=timedelta(hours=1), task_queue=queue)
        assert handle.id == SCHEDULE_ID
        try:
            # Same code path again: an update, not an error; the window follows the interval
            # and no settle lag, so the action time itself closes the window.
            handle = await ensure_schedule(
                client, every=timedelta(hours=2), task_queue=queue, settle_lag_s=0.0
            )
            desc = await handle.describe()
            assert desc.schedule.spec.intervals == [ScheduleIntervalSpec(every=timedelta(hours=2))]
            before = await world.db_now()
            await handle.trigger()
            workflow_id = await first_action(handle)
            run = client.get_workflow_handle_for(ReconcileWorkflow.run, workflow_id)
            report = await run.result()
        finally:
            await handle.delete()
    assert report.samples["movement_without_attempt"] == [movement_id]
    assert workflow_id.startswith("reconcile")
    # The window is the interval that closed at the action time (which Temporal records at
    # whole-second precision), not some other hour.
    start, end = (
        datetime.fromisoformat(report.window_start),
        datetime.fromisoformat(report.window_end),
    )
    assert end - start == timedelta(hours=2)
    assert before.replace(microsecond=0) <= end <= await world.db_now()


async def first_action(handle: object) -> str:
    """Poll the schedule until its triggered action has started (bounded wait, no timing claim)."""
    from temporalio.client import ScheduleActionExecutionStartWorkflow, ScheduleHandle

    assert isinstance(handle, ScheduleHandle)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        desc = await handle.describe()
        for action in desc.info.recent_actions:
            started = action.action
            if isinstance(started, ScheduleActionExecutionStartWorkflow):
                return started.workflow_id
        await asyncio.sleep(0.1)
    raise AssertionError("the schedule did not start the workflow")


async def test_a_terminated_payouts_workflow_is_driven_again(
    temporal_env: WorkflowEnvironment, world: World
) -> None:
    """A payout whose workflow a person terminated is found by the scheduled run and gets a new
    workflow (issue 24, item 5); a second run finds it running and starts nothing."""
    client = temporal_env.client
    payout_id = await world.new_payout(700)
    account = await world.pool.fetchval(
        "SELECT account_id FROM paydb.payouts WHERE payout_id = $1", payout_id
    )
    parked = f"nobody-{uuid.uuid4()}"  # no worker: the workflow only has to exist
    assert await start_payout(client, parked, PayoutInput(payout_id=payout_id, account_id=account))
    handle = client.get_workflow_handle(f"payout-{payout_id}")
    await handle.terminate(reason="test: an operator's mistake")
    inp = ReconcileInput(window_s=60.0, window_end=(await world.db_now()).isoformat())
    async with worker(temporal_env, world) as queue:
        first = await client.execute_workflow(
            ReconcileWorkflow.run, inp, id=f"reconcile-test-{uuid.uuid4()}", task_queue=queue
        )
        second = await client.execute_workflow(
            ReconcileWorkflow.run, inp, id=f"reconcile-test-{uuid.uuid4()}", task_queue=queue
        )
    assert first.redriven == [f"{payout_id}:PENDING:TERMINATED"]
    assert second.redriven == []
    desc = await handle.describe()
    assert desc.status is not None and desc.status.name == "RUNNING"
    await handle.terminate(reason="test done")
