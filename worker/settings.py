"""The worker's settings: everything a worker process reads from the environment (prefix
`WORKER_`, and the reconciler's `RECONCILE_*` for the ReconcileWorkflow activity it runs), read
once at start and passed down, and the `--help` text that lists them.
"""

from __future__ import annotations

import socket
import uuid

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.tls import ClientTLS, ServerTLS, refuse_unverified_database_url
from reconcile.reconciler import AMBIGUITY_SLA_S, RAIL_ADMIN_URL

__all__ = ["WorkerSettings", "settings_help"]


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


def settings_help() -> str:
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
