"""Prometheus metrics of the rail proxy. No label ever carries a payout, account, reference or token
(NFR-09): labels are small closed sets (outcome, reason code, circuit state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from railproxy.resilience import CircuitState


class ProxyMetrics:
    """One registry per app instance, so several proxies can live in one test process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("railproxy_submit_requests", "Submit requests received", registry=r)
        self.outcomes = Counter(
            "railproxy_submit_outcomes",
            "Recorded outcomes of forwarded attempts",
            ["outcome"],
            registry=r,
        )
        self.rejections = Counter(
            "railproxy_rejections", "Submissions rejected before forwarding", ["code"], registry=r
        )
        self.latency = Histogram(
            "railproxy_forward_seconds",
            "Latency of forwards to the rail",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
            registry=r,
        )
        self.circuit = Gauge(
            "railproxy_circuit_state", "1 for the breaker's current state", ["state"], registry=r
        )
        self.in_flight = Gauge("railproxy_in_flight", "Submissions holding a slot", registry=r)
        self.lookups = Counter(
            "railproxy_lookups", "Read-only lookups by result", ["result"], registry=r
        )

    def set_circuit(self, state: CircuitState) -> None:
        for s in CircuitState:
            self.circuit.labels(state=s.value).set(1 if s is state else 0)
