"""The worker's Temporal runtime: the SDK core's log lines forwarded as JSON events, and the SDK's
own Prometheus metrics when WORKER_SDK_METRICS_PORT is set.
"""

from __future__ import annotations

import logging

from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from worker.settings import WorkerSettings

__all__ = ["CORE_LOGGER", "runtime", "telemetry_config"]


#: The SDK core's (Rust) log lines come through this logger, so they are JSON events like every
#: other line of the worker's log (`log.temporalio.core`, the core's target in `message`).
CORE_LOGGER = "temporalio.core"


def telemetry_config(settings: WorkerSettings) -> TelemetryConfig:
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


def runtime(settings: WorkerSettings) -> Runtime:
    return Runtime(telemetry=telemetry_config(settings))
