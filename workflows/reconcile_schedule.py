"""The Temporal Schedule `reconcile-hourly`: one ReconcileWorkflow per interval (UC-07, FR-26).

Owns: the Schedule's definition and its idempotent create-or-update, client side (never run
inside a workflow), shared by `payouts reconcile schedule`, the local stack and compose's
`reconcile-schedule` job. Must never: start a reconciliation itself, or write to any database.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleIntervalSpec,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from activities.reconcile_models import ReconcileInput
from common.logs import get_logger
from workflows.reconcile import ReconcileWorkflow

__all__ = ["SCHEDULE_ID", "build_schedule", "ensure_schedule"]

SCHEDULE_ID = "reconcile-hourly"
log = get_logger("workflows.reconcile_schedule")


def build_schedule(*, every: timedelta, task_queue: str, settle_lag_s: float) -> Schedule:
    """The Schedule: one ReconcileWorkflow per interval over the interval that just closed."""
    action = ScheduleActionStartWorkflow(
        ReconcileWorkflow.run,
        ReconcileInput(window_s=every.total_seconds(), settle_lag_s=settle_lag_s),
        id="reconcile",  # Temporal appends the action time, so each run has its own id
        task_queue=task_queue,
        execution_timeout=timedelta(minutes=30),
    )
    return Schedule(
        action=action,
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # Runs missed while Temporal was down are caught up (each reconciles its own window,
        # from its own scheduled time); a run still going makes the next one wait (default SKIP).
        policy=SchedulePolicy(catchup_window=timedelta(days=1)),
    )


async def ensure_schedule(
    client: Client,
    *,
    every: timedelta,
    task_queue: str,
    settle_lag_s: float = 300.0,
    schedule_id: str = SCHEDULE_ID,
) -> ScheduleHandle:
    """Create the Schedule, or replace its definition if it already exists (idempotent)."""
    schedule = build_schedule(every=every, task_queue=task_queue, settle_lag_s=settle_lag_s)
    try:
        handle = await client.create_schedule(schedule_id, schedule)
        log.info(
            "reconcile.schedule_created", schedule_id=schedule_id, every_s=every.total_seconds()
        )
        return handle
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await handle.update(replace)
        log.info(
            "reconcile.schedule_updated", schedule_id=schedule_id, every_s=every.total_seconds()
        )
        return handle
