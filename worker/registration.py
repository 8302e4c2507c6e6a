"""The one place where a worker process registers what it runs: the workflows and activities of
the shared task queue and the activities of its own holder queue
(docs/architecture.md#workflow-shape).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from activities.payout_activities import PayoutActivities
from activities.reconcile import ReconcileActivities
from activities.redrive import RedriveActivities
from common.logs import get_logger
from worker.settings import WorkerSettings
from workflows.payout import PayoutWorkflow
from workflows.reconcile import ReconcileWorkflow

__all__ = ["temporal_workers"]

log = get_logger("worker")


@contextlib.asynccontextmanager
async def temporal_workers(
    settings: WorkerSettings,
    client: Client,
    worker_queue: str,
    acts: PayoutActivities,
    reconciler: ReconcileActivities,
) -> AsyncIterator[None]:
    """The two Temporal workers of this process (the shared queue's and its own holder queue's),
    polling for the duration of the block."""
    # Re-drives payouts a person left without a workflow; reads paydb with the reconciler's
    # read-only pool, starts workflows on this shared queue.
    redrive = RedriveActivities(reconciler.pool, client, settings.task_queue)
    shared = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[PayoutWorkflow, ReconcileWorkflow],
        activities=[
            *acts.shared_queue_activities(),
            reconciler.reconcile,
            redrive.redrive_stranded_payouts,
        ],
        # How long a workflow task waits for the worker that has the workflow cached
        # before any worker may take it (and replay the whole history). Not shorter: on
        # a busy machine a 3 s timeout fired for healthy workers, and every timeout was
        # a replay, which made the machine busier still (a 2,000-payout run fell to
        # 1 payout/s). A paused or dead worker's workflows move on after this. Never
        # longer than one lock TTL, so that a frozen holder's workflows are taken over
        # within about two lease lengths (issue 16); 10 s at the default 15 s TTL.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=min(10.0, settings.lock_ttl_s)),
        max_concurrent_activities=settings.shared_max_concurrent_activities,
    )
    holder = Worker(
        client,
        task_queue=worker_queue,
        activities=acts.holder_queue_activities(),
        max_concurrent_activities=settings.max_concurrent_activities,
    )
    async with shared, holder:
        if not settings.reconcile_token_file:
            log.warning(
                "worker.reconcile_credential_missing",
                why="RECONCILE_TOKEN_FILE is not set: this worker's reconcile activity fails "
                "(retried) instead of reading the rail's movement log",
            )
        log.info(
            "worker.started",
            worker_id=settings.worker_id,
            task_queue=settings.task_queue,
            worker_queue=worker_queue,
            enforce_fencing=settings.enforce_fencing,
            experiment_mode=settings.experiment_mode,
        )
        yield
