"""Every metrics and health endpoint of a running local stack, with its Prometheus job.

Owns: the one list of what Prometheus scrapes and what a person probes on a `Stack` (each
process's /metrics and /health, each worker's Temporal SDK metrics, the Temporal dev server's
metrics, each etcd member), named by the job of ops/prometheus/prometheus.yml that scrapes it.
`payouts up` prints it, the environment file exports it and the local Prometheus config is
rendered from it. Must never: start, probe or signal anything (it reads addresses only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stack.balancer import service_of

if TYPE_CHECKING:
    from stack.running import RunningStack


@dataclass(frozen=True)
class Endpoint:
    """One HTTP endpoint: `url` serves /metrics, and /health too when `health` is True."""

    process: str
    #: The scrape job of ops/prometheus/prometheus.yml that collects it.
    job: str
    url: str
    health: bool

    @property
    def host(self) -> str:
        """host:port, as a Prometheus target."""
        return self.url.split("://", 1)[-1].rstrip("/")


#: Stack service -> (job, serves /health as well as /metrics).
_SERVICES = {
    "lock-server": ("lock-server", True),
    "railstub": ("railstub", True),
    "railproxy": ("railproxy", True),
    "finledger": ("finledger", True),
    "outbox": ("outbox", False),
}


def endpoints(stack: RunningStack) -> list[Endpoint]:
    """Every endpoint of the stack's running processes, in a stable order."""
    out: list[Endpoint] = []
    procs = stack.processes
    for service, (job, health) in _SERVICES.items():
        # The service itself, or each of its replicas (`railproxy-1`, ...; stack.balancer).
        for name in sorted(n for n in procs if service_of(n, _SERVICES) == service):
            url = procs[name].url
            if url:
                out.append(Endpoint(name, job, url, health))
    for name in stack.workers:
        info = procs.get(name)
        if info is None or not info.url:
            continue
        out.append(Endpoint(name, "worker", info.url, True))
        if info.sdk_metrics_url:
            sdk = Endpoint(f"{name} (Temporal SDK)", "worker-sdk", info.sdk_metrics_url, False)
            out.append(sdk)
    if "temporal" in procs and stack.config.ports.temporal_metrics:
        url = f"http://127.0.0.1:{stack.config.ports.temporal_metrics}"
        out.append(Endpoint("temporal", "temporal", url, False))
    for i, host in enumerate(stack.etcd_endpoints):
        url = host if "://" in host else f"http://{host}"  # https://: the embedded, TLS etcd
        out.append(Endpoint(f"etcd m{i}", "etcd", url, True))
    return out
