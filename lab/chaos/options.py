"""A chaos run's options and the settings it runs with (`payouts-lab chaos`, lab.chaos.run): the
workflow timings, the workers' lease and environment, the accounts' funding and the payouts'
amounts, and the private stack's configuration.

Owns: what a run is configured with. Must never: start anything, or point a run at anything but
its own embedded servers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lab.chaos.rail import RAIL_BASELINE
from lab.experiments.harness import FAST_WORKFLOW, WORKER_ENV, isolated_ports
from stack.config import StackConfig

__all__ = [
    "ACCOUNT_BALANCE",
    "ARMED_SUBMIT_DEADLINE_S",
    "CHAOS_LOCK_TTL_S",
    "CHAOS_WORKER_ENV",
    "CHAOS_WORKFLOW",
    "MAX_AMOUNT",
    "MIN_AMOUNT",
    "ChaosOptions",
    "stack_config",
]

#: FAST_WORKFLOW's short backoffs and holder timeouts. The submit deadline leaves an armed worker
#: frozen before its submission time for another worker to take the payout over and submit it
#: (the freeze ends then, chaos_faults), so its thawed request reaches the fence checks (fencing
#: on: refused as stale; off: the duplicate the negative control needs) instead of being refused
#: earlier as DEADLINE_EXCEEDED.
#: The resolution SLA is short enough that an ambiguity nothing can resolve escalates within the
#: run (INV-10 accepts RAIL_AMBIGUOUS only when escalated) and longer than a rail_slow payout
#: needs to resolve (the rail answers within submit deadline + 12 s), so those resolve first.
CHAOS_WORKFLOW = {**FAST_WORKFLOW, "submit_deadline_s": 90.0, "resolution_sla_s": 150.0}
#: The workers' session TTL (their lease). Longer than the experiments' 3 s so that the window
#: in which a lock-server outage fails a release while every session survives (longer than the
#: SDK's bounded retries, shorter than the TTL minus a heartbeat: lab.chaos.locks) holds a
#: restart of the lock server with room to spare, and reaches the 6-8 s outages of issue 24.
CHAOS_LOCK_TTL_S = 10.0
#: The submit deadline of the payout the armed pause #0 freezes on (see
#: lab.chaos.workload.start_under_faults).
ARMED_SUBMIT_DEADLINE_S = 600.0
CHAOS_WORKER_ENV = {**WORKER_ENV, "WORKER_LOCK_TTL_S": str(CHAOS_LOCK_TTL_S)}
ACCOUNT_BALANCE = 100_000_000  # minor units: funds never run out, so FAILED means a real refusal
MIN_AMOUNT, MAX_AMOUNT = 100, 5_000


@dataclass(frozen=True)
class ChaosOptions:
    payouts: int
    accounts: int
    workers: int
    seed: int
    backend: Literal["postgres", "etcd"] = "postgres"
    fencing: bool = True
    run_dir: Path | None = None
    #: Hard cap on settling after the last fault, however steady the progress.
    settle_timeout_s: float = 3600.0
    #: Settling fails once no payout changed state for this long while some are still open:
    #: the run is judged on progress, not on a guess of how fast this machine drains N payouts.
    #: Longer than the resolution SLA: an ambiguous payout's next change may be its escalation.
    stall_s: float = 240.0
    #: Escalated ambiguous payouts count as settled once no payout changed state for this long.
    quiet_s: float = 10.0
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    #: "sync": PostgreSQL on a primary with a synchronous standby (stack.replication), and the
    #: schedule gets a db_failover. The default: the production shape (issue 26).
    postgres_standby: Literal["none", "sync"] = "sync"
    #: Lock servers, rail proxies and outbox publishers each, behind the balancer (issue 26
    #: §1); 2 or more schedules the replica faults (lab.chaos.replicas).
    replicas: int = 2


def stack_config(opts: ChaosOptions) -> StackConfig:
    run_dir = opts.run_dir or Path(".run") / f"chaos-{opts.seed}-{uuid.uuid4().hex[:6]}"
    railstub_env = {
        "RAILSTUB_SEED": str(opts.seed),
        "RAILSTUB_LATENCY_MODE": "fixed",
        "RAILSTUB_LATENCY_FIXED_MS": str(RAIL_BASELINE["latency_fixed_ms"]),
        "RAILSTUB_AMBIGUITY_RATE": "0",
    }
    env = {"railstub": railstub_env, **opts.service_env}
    return StackConfig.from_env(
        # Embedded servers only: the run restarts PostgreSQL and kills etcd members itself.
        database_url=None,
        etcd_endpoints=None,
        backend=opts.backend,
        run_dir=run_dir,
        workers=0,
        fencing=opts.fencing,
        ports=isolated_ports(),
        etcd_members=3 if opts.backend == "etcd" else 1,
        postgres_standby=opts.postgres_standby,
        replicas=opts.replicas,
        service_env=env,
    )
