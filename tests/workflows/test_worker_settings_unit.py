"""The worker process reads its whole environment into one `WorkerSettings`: its own WORKER_*
variables and the reconciler's RECONCILE_* ones for the ReconcileWorkflow activity it runs."""

from __future__ import annotations

import pytest

from reconcile.reconciler import ReconcileSettings
from worker.settings import WorkerSettings

#: The reconciler's variables the worker's ReconcileWorkflow activity uses, by field name.
SHARED = ("database_url", "rail_admin_url", "token_file", "ambiguity_sla_s")


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SHARED:
        monkeypatch.delenv(f"RECONCILE_{name.upper()}", raising=False)


def test_reads_the_reconcilers_variables_under_their_own_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv(
        "RECONCILE_DATABASE_URL", "postgresql://payouts_reconciler@db/payouts?sslmode=verify-full"
    )
    monkeypatch.setenv("RECONCILE_RAIL_ADMIN_URL", "http://railstub:8710")
    monkeypatch.setenv("RECONCILE_TOKEN_FILE", "/run/credentials/reconciler.token")
    monkeypatch.setenv("RECONCILE_AMBIGUITY_SLA_S", "60")
    monkeypatch.setenv(
        "WORKER_DATABASE_URL", "postgresql://payouts_paydb@db/payouts?sslmode=verify-full"
    )
    settings = WorkerSettings()
    assert (
        settings.reconcile_database_url
        == "postgresql://payouts_reconciler@db/payouts?sslmode=verify-full"
    )
    assert settings.reconcile_rail_admin_url == "http://railstub:8710"
    assert settings.reconcile_token_file == "/run/credentials/reconciler.token"
    assert settings.reconcile_ambiguity_sla_s == 60.0
    assert (
        settings.database_url == "postgresql://payouts_paydb@db/payouts?sslmode=verify-full"
    )  # its own, apart


def test_the_same_variable_unset_means_the_same_as_for_the_reconciler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear(monkeypatch)
    worker, reconciler = WorkerSettings(), ReconcileSettings()
    for name in SHARED:
        assert getattr(worker, f"reconcile_{name}") == getattr(reconciler, name), name


def test_metrics_servers_bind_loopback_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25: Prometheus in another container could scrape no worker. The default stays
    127.0.0.1 (a local run); WORKER_METRICS_HOST moves our /metrics+/health server (the SDK's,
    which takes the same setting, is shown scraped from another container by make
    compose-smoke's worker-sdk job)."""
    from activities import worker_http
    from worker.telemetry import telemetry_config

    monkeypatch.delenv("WORKER_METRICS_HOST", raising=False)
    assert WorkerSettings().metrics_host == "127.0.0.1"
    monkeypatch.setenv("WORKER_METRICS_HOST", "0.0.0.0")
    monkeypatch.setenv("WORKER_SDK_METRICS_PORT", "0")
    settings = WorkerSettings()
    assert settings.metrics_host == "0.0.0.0" and telemetry_config(settings).metrics is None
    server = worker_http.serve(worker_http.HealthSnapshot(), 0, host=settings.metrics_host)
    try:
        assert server.server_address[0] == "0.0.0.0"
    finally:
        server.shutdown()
        server.server_close()


def test_the_sdk_cores_log_lines_go_through_the_json_logger() -> None:
    """Issue 28 §5: the Rust core's warnings were coloured text in the worker's JSON log; they
    are forwarded to the standard library's `temporalio.core` logger (common.logs renders it),
    under one stable name, not one per core target."""
    from worker.telemetry import CORE_LOGGER, telemetry_config

    logging_config = telemetry_config(WorkerSettings()).logging
    assert logging_config is not None and logging_config.forwarding is not None
    assert logging_config.forwarding.logger.name == CORE_LOGGER
    assert logging_config.forwarding.append_target_to_name is False
