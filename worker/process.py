"""One worker process from start to stop: its health endpoint, its Temporal client, its pools, its
lock session and rail proxy client, the activities over them, its background loops and its
Temporal workers (`worker.registration`), all closed in order when `stop` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from datetime import timedelta
from typing import Any

from temporalio.client import Client

from activities import backlog_metrics, worker_http
from activities.payout_activities import PayoutActivities
from activities.reconcile import ReconcileActivities
from common import tracing
from common.credentials import read_token
from common.logs import get_logger
from common.pgutil import create_pool
from common.temporal_tls import temporal_tls
from ledger import PayoutStore
from lockservice.sdk import LockClient
from railproxy.client import RailProxyClient
from reconcile.reconciler import component_movement_source
from worker.registration import temporal_workers
from worker.settings import WorkerSettings
from worker.startup import check_start, grant_verifier
from worker.telemetry import runtime

__all__ = ["run"]

log = get_logger("worker")


async def run(settings: WorkerSettings, stop: asyncio.Event) -> None:
    """Run one worker process until `stop` is set, then close everything it opened."""
    await check_start(settings)  # FR-29: before anything starts
    worker_queue = f"{settings.task_queue}-holder-{settings.worker_id}"
    health = worker_http.HealthSnapshot()
    http = (
        worker_http.serve(
            health,
            settings.metrics_port,
            host=settings.metrics_host,
            tls=settings.server_context(),  # WORKER_TLS_CERT_FILE / WORKER_TLS_KEY_FILE
        )
        if settings.metrics_port
        else None
    )
    client = await Client.connect(
        settings.temporal_address,
        namespace=settings.namespace,
        tls=temporal_tls(),  # checked by check_start: TEMPORAL_TLS_* (common.temporal_tls)
        runtime=runtime(settings),
        # Spans of workflows, activities and starts, and their context in every header; the
        # workers below inherit it from this client (common.tracing).
        interceptors=tracing.temporal_interceptors(),
    )
    # A transaction of this process left idle longer than its lease (it was frozen between its
    # UPDATEs and its COMMIT) is ended by PostgreSQL: rolled back, its rows free for the next
    # holder, whose grant is newer by then (common.pgutil.create_pool, docs/payment-database.md).
    pool = await create_pool(
        settings.database_url, min_size=1, max_size=10, idle_in_transaction_s=settings.lock_ttl_s
    )
    # The reconciler reads both schemas with its own read-only role, not the payment store's.
    rec_pool = pool
    if settings.reconcile_database_url:
        rec_pool = await create_pool(settings.reconcile_database_url, min_size=0, max_size=2)
    try:
        token = read_token(token_file=settings.token_file, what="WORKER_TOKEN_FILE")
        # Every server this worker calls is checked against WORKER_TLS_CA_FILE (common.tls).
        verify = settings.client_verify()
        store = PayoutStore(
            pool,
            enforce_fencing=settings.enforce_fencing,
            verifier=grant_verifier(settings),
            verify_assertions=settings.verify_operator_assertions,
        )
        async with (
            LockClient(
                settings.lock_url,
                ttl_s=settings.lock_ttl_s,
                heartbeat_s=settings.lock_heartbeat_s,
                safety_margin=settings.lock_safety_margin,
                token=token,
                verify=verify,
            ) as locks,
            RailProxyClient(settings.railproxy_url, token=token, verify=verify) as proxy,
            PayoutActivities(
                locks=locks,
                store=store,
                proxy=proxy,
                worker_queue=worker_queue,
                worker_id=settings.worker_id,
                lock_url=settings.lock_url,
                token=token,
                verify=verify,
                pause_before_submit=settings.experiment_pause_before_submit,
                crash_at=settings.experiment_crash_at,
                # Hands every acquired grant over itself, and gives back one nobody received.
                temporal=client,
            ) as acts,  # closed after the workers below have stopped
        ):
            reconciler = ReconcileActivities(
                rec_pool,
                # Its own credential only: never the operator's (least privilege).
                component_movement_source(
                    settings.reconcile_rail_admin_url, settings.reconcile_token_file, verify=verify
                ),
                sla=timedelta(seconds=settings.reconcile_ambiguity_sla_s),
            )
            background = [
                acts.sweep_idle_leases(settings.lease_idle_s),
                worker_http.refresh_forever(
                    health, client.service_client.check_health, locks.session_state
                ),
                backlog_metrics.refresh_forever(pool),
            ]
            workers = temporal_workers(settings, client, worker_queue, acts, reconciler)
            async with _background(background), workers:
                await stop.wait()
            log.info("worker.stopped", worker_id=settings.worker_id)
    finally:
        if rec_pool is not pool:
            await rec_pool.close()
        await pool.close()
        if http is not None:
            http.shutdown()


@contextlib.asynccontextmanager
async def _background(loops: list[Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run the process's background loops (idle-lease sweeper, health, backlog metrics) for the
    duration of the block; cancelled and awaited when it ends."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
