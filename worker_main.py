"""A payout worker process: the Temporal workflow worker and the activity workers, holder of one
lock session.

Two task queues per process (docs/architecture.md#workflow-shape, the samples-python
`worker_specific_task_queues` pattern): the shared queue (`WORKER_TASK_QUEUE`, default `payouts`)
runs workflows and the activities that need no grant (acquire, lookup, escalate, revoke); this
process's own queue runs the critical section (claim, submit, post, release) so that it executes
where the lock session lives. If this process dies, its queue goes silent and the workflows
re-acquire elsewhere with a higher token.

Run: `python worker_main.py` (settings from the environment, prefix `WORKER_`, and the reconciler's
`RECONCILE_*` variables for the ReconcileWorkflow activity it runs; see README). One settings
object, `WorkerSettings`, is read once at start and passed down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from datetime import timedelta
from typing import Any

import httpx
from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio.client import Client
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.worker import Worker

from activities import backlog_metrics, worker_http
from activities.payout_activities import PayoutActivities
from activities.reconcile import ReconcileActivities
from activities.redrive import RedriveActivities
from common import tracing
from common.credentials import CredentialsError, read_token
from common.exiting import exit_now, load_settings
from common.logs import configure_logging, get_logger
from common.pgutil import create_pool
from common.temporal_tls import TemporalTLSError, temporal_tls
from common.tls import ClientTLS, ServerTLS, refuse_unverified_database_url
from ledger import PayoutStore
from lockservice.sdk import LockClient
from lockservice.verifiers import GrantVerifier, verifier_from_settings
from railproxy.client import RailProxyClient
from reconcile.reconciler import (
    AMBIGUITY_SLA_S,
    RAIL_ADMIN_URL,
    component_movement_source,
)
from workflows.payout import PayoutWorkflow
from workflows.reconcile import ReconcileWorkflow

log = get_logger("worker")


def _reconciler(name: str) -> AliasChoices:
    """A reconciler's variable (prefix RECONCILE_, reconcile.reconciler.ReconcileSettings)."""
    return AliasChoices(f"RECONCILE_{name.upper()}")


class WorkerSettings(ServerTLS, ClientTLS, BaseSettings):
    """Everything a worker process reads from the environment, read once (`main`)."""

    model_config = SettingsConfigDict(env_prefix="WORKER_", extra="ignore")

    temporal_address: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "payouts"
    database_url: str = Field(
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        validation_alias=AliasChoices("WORKER_DATABASE_URL", "DATABASE_URL"),
    )
    lock_url: str = "http://127.0.0.1:8701"
    #: The worker's bearer token (component `worker`, common.credentials) for the lock server and
    #: the rail proxy: a file holding it (`WORKER_TOKEN_FILE`), never the token itself.
    token_file: str | None = None
    railproxy_url: str = "http://127.0.0.1:8720"
    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}",
        validation_alias=AliasChoices("WORKER_ID"),
    )
    metrics_port: int = 0  # /metrics and /health; 0: no HTTP endpoint
    #: The address both metrics servers (ours on metrics_port, the SDK's on sdk_metrics_port)
    #: bind. The default keeps a local run's endpoints off the network; a container sets
    #: 0.0.0.0 so that Prometheus on another host can scrape them (compose, k8s).
    metrics_host: str = "127.0.0.1"
    #: The Temporal SDK's own Prometheus metrics (its Rust runtime serves them); 0: off.
    sdk_metrics_port: int = 0
    lock_ttl_s: float = 15.0
    lock_heartbeat_s: float = 5.0
    lock_safety_margin: float = 0.3
    # A grant no step has used for this long is released (a workflow that moved on leaked it).
    # Comfortably longer than the gap between two steps of one critical section: the step's
    # pickup is bounded by holder_pickup_s (10 s by default), but the workflow task that
    # schedules it is not, and on a saturated machine it can wait tens of seconds (30 s
    # released grants that were about to be used, in a 2,000-payout chaos run).
    lease_idle_s: float = 60.0
    # FR-29: experiment only. Off removes the fence condition from the payment database's writes;
    # it is logged loudly by the store at start-up, and refused unless in experiment mode.
    enforce_fencing: bool = True
    # INV-07: the lock service's public keys (a directory of `<kid>.pem` files or `kid=path,...`);
    # the payment store refuses every fenced write whose grant they do not verify. Required
    # while `verify_grants` is on; off (no verification) is experiment-only, like fencing.
    grant_public_keys: str | None = None
    verify_grants: bool = True
    # Break-glass abandon (a Temporal signal) needs the lock service's operator assertion,
    # checked with the same public keys; off (the free-text name is audited) is experiment-only.
    verify_operator_assertions: bool = True
    # Experiment mode: the worker starts only if its rail proxy reports `experiment_mode: true`
    # on /health (which the proxy sets only after verifying that its rail is the rail stub),
    # waiting at most `experiment_verify_s` for the proxy to answer.
    experiment_mode: bool = False
    experiment_verify_s: float = Field(default=10.0, gt=0)
    # UC-03 experiment only: SIGSTOP this process once, just before its first rail submission.
    experiment_pause_before_submit: bool = False
    # UC-04 experiment only: SIGKILL this process right after a payout reaches this state.
    experiment_crash_at: str = ""
    # The holder queue's steps each hold a database connection or a rail call: keep them few.
    max_concurrent_activities: int = 50
    # The shared queue's activities are mostly acquires blocked on an account's lock (a socket
    # and a coroutine each, no CPU). Too few slots and the waiters of busy accounts fill them
    # while acquires for idle accounts queue behind them in Temporal.
    shared_max_concurrent_activities: int = 1000
    # The hourly ReconcileWorkflow's activity runs here as the reconciler: with its read-only
    # role (unset: the worker's own DSN, docs/database-roles.md), its token for the rail's
    # movement log, and the same variables as `payouts reconcile` (prefix RECONCILE_).
    reconcile_database_url: str | None = Field(
        default=None, validation_alias=_reconciler("database_url")
    )
    reconcile_rail_admin_url: str = Field(
        default=RAIL_ADMIN_URL, validation_alias=_reconciler("rail_admin_url")
    )
    reconcile_token_file: str | None = Field(
        default=None, validation_alias=_reconciler("token_file")
    )
    reconcile_ambiguity_sla_s: float = Field(
        default=AMBIGUITY_SLA_S, validation_alias=_reconciler("ambiguity_sla_s")
    )

    @model_validator(mode="after")
    def _database_tls(self) -> WorkerSettings:
        for url, variable in (
            (self.database_url, "WORKER_DATABASE_URL"),
            (self.reconcile_database_url, "RECONCILE_DATABASE_URL"),
        ):
            refuse_unverified_database_url(url, variable, experiment_mode=self.experiment_mode)
        return self


class StartupRefused(Exception):
    """The worker must not start (FR-29); the message names the variable to change."""


async def check_start(settings: WorkerSettings) -> None:
    """Refuse fencing off outside experiment mode, and experiment mode unless the rail proxy is
    in (verified) experiment mode itself: so a worker with fencing off only ever talks to a
    proxy that talks to the rail stub, never to a real rail. A token file that is set but cannot
    be read is refused here too, before anything (a port, a pool, a connection) has started."""
    for variable, path in (
        ("WORKER_TOKEN_FILE", settings.token_file),
        ("RECONCILE_TOKEN_FILE", settings.reconcile_token_file),
    ):
        try:
            read_token(token_file=path, what=variable)
        except CredentialsError as exc:
            raise StartupRefused(f"{exc}; refusing to start") from exc
    try:
        temporal_tls()
    except TemporalTLSError as exc:
        raise StartupRefused(f"{exc}; refusing to start") from exc
    off = [
        name
        for name, on in (
            ("WORKER_ENFORCE_FENCING", settings.enforce_fencing),
            ("WORKER_VERIFY_GRANTS", settings.verify_grants),
            ("WORKER_VERIFY_OPERATOR_ASSERTIONS", settings.verify_operator_assertions),
        )
        if not on
    ]
    if not settings.experiment_mode:
        if off:
            raise StartupRefused(
                f"{' and '.join(f'{n}=false' for n in off)} is experiment-only (FR-29): refusing "
                "to start without WORKER_EXPERIMENT_MODE=true and a rail proxy in experiment mode"
            )
        grant_verifier(settings)  # the public keys must load, before anything starts
        return
    why = "WORKER_EXPERIMENT_MODE=true"
    if off:
        why += f" (with {' and '.join(f'{n}=false' for n in off)})"
    deadline = time.monotonic() + settings.experiment_verify_s
    verify = settings.client_verify()
    async with RailProxyClient(settings.railproxy_url, read_timeout_s=2.0, verify=verify) as proxy:
        while True:
            try:
                health = await proxy.health()
            except (httpx.TransportError, ValueError) as exc:
                last = type(exc).__name__  # not listening yet? ask again until the deadline
            else:
                if health.get("experiment_mode") is True:
                    grant_verifier(settings)
                    return
                raise StartupRefused(
                    f"{why} but the rail proxy at {settings.railproxy_url} is not in experiment "
                    f"mode (its /health: experiment_mode={health.get('experiment_mode')!r}): "
                    "refusing to start"
                )
            if time.monotonic() >= deadline:
                raise StartupRefused(
                    f"{why} but the rail proxy at {settings.railproxy_url} did not answer within "
                    f"{settings.experiment_verify_s:g}s ({last}): refusing to start"
                )
            await asyncio.sleep(0.2)


def grant_verifier(settings: WorkerSettings) -> GrantVerifier | None:
    """The payment store's grant verifier; None only with WORKER_VERIFY_GRANTS=false."""
    try:
        return verifier_from_settings(
            settings.verify_grants, settings.grant_public_keys, "WORKER_GRANT_PUBLIC_KEYS"
        )
    except ValueError as exc:
        raise StartupRefused(str(exc)) from exc


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
        runtime=_runtime(settings),
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
            workers = _workers(settings, client, worker_queue, acts, reconciler)
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


@contextlib.asynccontextmanager
async def _workers(
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


#: The SDK core's (Rust) log lines come through this logger, so they are JSON events like every
#: other line of the worker's log (`log.temporalio.core`, the core's target in `message`).
CORE_LOGGER = "temporalio.core"


def _telemetry(settings: WorkerSettings) -> TelemetryConfig:
    """The worker's Temporal telemetry: the SDK core's log lines forwarded to the standard library
    (common.logs renders them as JSON; otherwise the core prints coloured text on stderr), and
    the SDK's own metrics (poll latencies, task slots, sticky cache hits) served on
    WORKER_SDK_METRICS_PORT when it is set."""
    forwarding = LogForwardingConfig(
        logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False
    )
    core_logs = LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"), forwarding=forwarding
    )
    prometheus = None
    if settings.sdk_metrics_port:
        prometheus = PrometheusConfig(
            bind_address=f"{settings.metrics_host}:{settings.sdk_metrics_port}"
        )
    return TelemetryConfig(logging=core_logs, metrics=prometheus)


def _runtime(settings: WorkerSettings) -> Runtime:
    return Runtime(telemetry=_telemetry(settings))


def _settings_help() -> str:
    """Every setting as the environment variable that sets it, with its default."""
    rows = []
    for name, field in WorkerSettings.model_fields.items():
        alias = field.validation_alias
        env = (
            " or ".join(str(c) for c in alias.choices)
            if isinstance(alias, AliasChoices)
            else f"WORKER_{name.upper()}"
        )
        default = "(generated)" if field.default_factory is not None else repr(field.default)
        rows.append(f"  {env:<44} default {default}")
    return "settings (environment variables):\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """`python worker_main.py [--help]`: run one worker until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python worker_main.py",
        description="A payout worker: runs payout and reconcile workflows and their activities, "
        "and holds this process's lock session. Configured by environment variables only.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    settings = load_settings("worker", WorkerSettings)
    # Checked first, before logging is configured, for a clean refusal (one line on stderr,
    # exit 2, nothing started); `run` checks again for any other caller.
    try:
        asyncio.run(check_start(settings))
    except StartupRefused as exc:
        sys.stderr.write(f"worker: {exc}\n")
        raise SystemExit(2) from None
    configure_logging("worker", service=True)
    tracing.setup("worker", instance=settings.worker_id)

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run(settings, stop)

    asyncio.run(_main())
    # Every resource is closed by now; skip the interpreter teardown that the Temporal SDK can
    # crash, so a clean stop exits 0 (common.exiting).
    exit_now(0)


if __name__ == "__main__":
    main()
