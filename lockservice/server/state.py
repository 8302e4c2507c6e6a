"""The lock server's per-app state and access rules: who may call which route (as FastAPI
dependencies over common.credentials, docs/architecture.md, Trust), and what every route runs
with: the backend, the grant signer, the restore watermark, the credentials and the metrics.

One `ServerState` per app (lockservice.server.app builds it), never module-level state, so that
several apps in one process (tests, benchmarks) never share a backend or a metric. Metric labels
are the operation and the outcome only, never a key, session or token (NFR-09).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter, Histogram

from common.credentials import Credentials, Identity, as_dependency, authorizer, require
from common.outage import connection_lost
from lockservice import api
from lockservice.api import LockBackend
from lockservice.server.signing import GrantSigner
from lockservice.server.watermark import Watermark
from lockservice.verifiers import DEFAULT_TTL_S, AssertionVerifier

T = TypeVar("T")

#: Who may call what (docs/architecture.md, Trust).
#: The worker holds grants; the invariant checker reads the
#: grant history; inspect is for operators (and the checker); force-revoke and bump-epoch are
#: break-glass: operators only. /health, /livez and /metrics stay open (network isolation).
WORKER = "worker"
READERS = ("worker", "invariants", "reconciler")


class ServerMetrics:
    """Per-app registry, so that several apps in one process (tests, bench) never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "lock_requests",
            "Lock-server requests by operation and outcome.",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "lock_request_seconds",
            "Lock-server request handling time by operation.",
            ["op"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
        )
        # The labelled children, looked up once: `labels()` takes a lock and builds a tuple per
        # call. Bounded: the keys are route names and outcomes (never a key, session or token).
        self._timers: dict[str, Any] = {}
        self._counts: dict[tuple[str, str], Any] = {}

    def record(self, op: str, outcome: str, seconds: float) -> None:
        """One backend call of `op` that ended with `outcome` after `seconds`."""
        timer = self._timers.get(op)
        if timer is None:
            timer = self._timers[op] = self.seconds.labels(op)
        count = self._counts.get((op, outcome))
        if count is None:
            count = self._counts[op, outcome] = self.requests.labels(op, outcome)
        timer.observe(seconds)
        count.inc()


_OUTCOME_OF: dict[type[Exception], str] = {
    api.InvalidRequest: "invalid",
    api.SessionNotFound: "session_not_found",
    api.NotHeld: "not_held",
    api.BackendUnavailable: "unavailable",
}


@dataclass
class ServerState:
    backend: LockBackend | None
    metrics: ServerMetrics
    default_ttl_s: float
    signer: GrantSigner
    #: Restored-data detection (lockservice.server.watermark); None: off (no LOCK_STATE_DIR).
    watermark: Watermark | None = None
    #: Accepted bearer tokens (common.credentials); None: authentication off (tests only;
    #: `main` refuses to start without LOCK_CREDENTIALS_PATH).
    credentials: Credentials | None = None
    #: Lifetime of the operator assertions this server issues (lockservice.verifiers.assertions).
    assertion_ttl_s: float = DEFAULT_TTL_S
    #: Off (experiment switch): a worker-sent force-revoke needs no operator assertion.
    verify_assertions: bool = True
    #: This replica's identity (LOCK_REPLICA_ID), answered by /health; the backend names it in
    #: its audit records. None: an app built in-process without one (tests).
    replica_id: str | None = None

    def assertion_verifier(self) -> AssertionVerifier:
        # This server's own public key: it checks what it signed, by its own clock.
        return AssertionVerifier({self.signer.kid: self.signer.public_key()})

    def be(self) -> LockBackend:
        if self.backend is None:  # only between process start and the end of lifespan start-up
            raise api.BackendUnavailable("lock backend not connected yet")
        return self.backend

    async def run(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """Time and count one backend call; errors propagate to the exception handlers."""
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await call()
        except api.LockError as exc:
            outcome = next((o for c, o in _OUTCOME_OF.items() if isinstance(exc, c)), "error")
            raise
        except Exception as exc:  # a driver error the backend did not map: the same outcome
            outcome = "unavailable" if connection_lost(exc) else "error"  # as the answer
            raise
        finally:
            self.metrics.record(op, outcome, time.perf_counter() - started)


def op_of(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "name", None) or "unknown")


@dataclass(frozen=True)
class Access:
    """Who may call which route (docs/architecture.md, Trust), as FastAPI dependencies."""

    #: The worker, which holds grants (sessions, acquire, renew, release).
    holder: list[Any]
    #: Reads of the grant state: the worker, the invariant checker, the reconciler, operators.
    reader: list[Any]
    #: Break-glass and the operator assertions: operators only.
    operator_only: Any
    #: Force-revoke also from the worker: the `payouts payout revoke` signal reaches the lock
    #: server through the worker's revoke activity. A signal is not authenticated (anyone who
    #: can reach Temporal can send one), so the worker's revoke is carried out only with the
    #: operator assertion this server signed for that payout and action
    #: (lockservice.verifiers.assertions), and the identity inside it is audited.
    revoker: Any
    #: The holder's dependency (in `holder`) and the same decision as a plain function, for the
    #: hot routes' fast path (lockservice.server.hotroute).
    holder_dependency: Callable[..., Any]
    holder_check: Callable[[str | None], Identity]

    @classmethod
    def of(cls, credentials: Credentials | None) -> Access:
        # One decision for both: the hot routes' fast path calls `holder_check` itself, every
        # other request reaches it through the dependency.
        holder_check = authorizer(credentials, components=(WORKER,))
        holder = as_dependency(holder_check)
        return cls(
            holder=[Depends(holder)],
            reader=[Depends(require(credentials, operator=True, components=READERS))],
            operator_only=Depends(require(credentials, operator=True)),
            revoker=Depends(require(credentials, operator=True, components=(WORKER,))),
            holder_dependency=holder,
            holder_check=holder_check,
        )
