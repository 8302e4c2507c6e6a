"""The chaos runner's fault schedule: a pure function of the seed (issue 7, STD01-13).

Owns: which faults a `payouts-lab chaos` run injects, in which order, at which offsets and with
which parameters. Every random draw comes from ONE `random.Random(seed)`, so the same seed (with
the same run shape: backend, workers, payouts) always gives the same schedule, which the run
prints and puts in its JSON summary. Must never: read a clock, the environment or any other
source of randomness, or perform I/O.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

FaultKind = Literal[
    "pause",
    "kill",
    "lock_server_restart",
    "lock_server_outage",
    "backend_restart",
    "rail_outage",
    "rail_ambiguity",
    "slow_lookups",
    "temporal_restart",
    "rail_restart",
    "rail_slow",
    "clock_skew",
    "hostile_signals",
    "finledger_restart",
    "db_failover",
    "lock_replica_kill",
    "proxy_replica_kill",
    "publisher_kill",
    "replica_freeze",
    "etcd_member_kill_frozen",
]

#: Kinds of a replicated run (`--replicas` >= 2, issue 26 §3): one lock-server replica, one rail
#: proxy replica (mid-forward) and one outbox publisher SIGKILLed and restarted, and one lock
#: server or proxy replica SIGSTOPped past its peers' timeouts.
REPLICA_KINDS: tuple[FaultKind, ...] = (
    "proxy_replica_kill",
    "lock_replica_kill",
    "publisher_kill",
    "replica_freeze",
)
#: ... and on the etcd backend, an etcd member killed while a lock-server replica is frozen.
ETCD_REPLICA_KINDS: tuple[FaultKind, ...] = ("etcd_member_kill_frozen",)
#: Kinds only a run of a particular topology schedules (once each, drawn after every other
#: fault so that the rest of a seed's schedule stays what it was): db_failover needs the
#: PostgreSQL primary/standby pair (`--postgres-standby sync`, stack.replication), the replica
#: kinds several replicas of each service.
TOPOLOGY_KINDS: tuple[FaultKind, ...] = ("db_failover", *REPLICA_KINDS, *ETCD_REPLICA_KINDS)
#: Every kind every run schedules, in report order. Both backends support all of them (etcd: a
#: leader kill).
FAULT_KINDS: tuple[FaultKind, ...] = tuple(
    k for k in get_args(FaultKind) if k not in TOPOLOGY_KINDS
)

#: Relative weights of the faults drawn after each kind has appeared once: worker faults are the
#: ones that exercise fencing, so they come up most often.
_WEIGHTS: dict[FaultKind, int] = {
    "pause": 4,
    "kill": 3,
    "lock_server_restart": 1,
    "lock_server_outage": 1,
    "backend_restart": 1,
    "rail_outage": 1,
    "rail_ambiguity": 2,
    "slow_lookups": 1,
    "temporal_restart": 1,
    "rail_restart": 1,
    "rail_slow": 1,
    "clock_skew": 1,
    "hostile_signals": 1,
    "finledger_restart": 1,
}


#: Rail behaviour windows: the range of the window's duration (s) and of its level (None: none).
_WINDOWS: dict[FaultKind, tuple[tuple[float, float], tuple[float, float] | None]] = {
    "rail_outage": ((2.0, 6.0), None),
    "rail_ambiguity": ((3.0, 8.0), (0.2, 0.6)),  # ambiguity_rate
    "slow_lookups": ((3.0, 8.0), (1.0, 4.0)),  # visibility_delay_s
    # Latency beyond the submit deadline, by this many seconds: the proxy's forward times out
    # into RAIL_AMBIGUOUS and the lookups run while the rail is still working on the movement.
    "rail_slow": ((2.0, 5.0), (3.0, 12.0)),
    "clock_skew": ((3.0, 8.0), (2.0, 30.0)),  # |offset| of the rail's clock, seconds
}


#: Kinds whose first occurrence fires right after the armed pause #0: they only bite while
#: submissions are still being made (a rail slower than the deadline slows nothing once every
#: payout is past its submission, which in a small run takes seconds), and the skew then falls
#: on the lookups of the payouts the slow rail made ambiguous.
EARLY_KINDS: tuple[FaultKind, ...] = ("rail_slow", "clock_skew")


class ScheduleError(ValueError):
    """The run shape cannot produce a schedule (e.g. no workers to pause)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: fired no earlier than `at_s` after the workload started, in schedule order."""

    index: int
    kind: FaultKind
    at_s: float
    #: pause: how long the worker stays stopped (longer than the lease); rail_outage,
    #: rail_ambiguity, slow_lookups, rail_slow, clock_skew: how long the window lasts;
    #: lock_server_outage: how long the lock server stays down (inside the run's outage window);
    #: kill/restarts: 0.
    duration_s: float = 0.0
    #: Which worker slot (0..workers-1) a pause or kill hits.
    target: int = 0
    #: pause only: restart the slot's worker armed with the UC-03 hook (it stops itself just
    #: before its first rail submission), so the check-then-act gap is hit for sure.
    armed: bool = False
    #: rail_ambiguity: ambiguity_rate in the window; slow_lookups: visibility_delay_s;
    #: rail_slow: seconds by which the rail's latency exceeds the run's submit deadline;
    #: clock_skew: the rail clock's offset in seconds (either sign: ahead or behind ours).
    level: float = 0.0
    #: hostile_signals: the seed of its choice of payouts (lab.chaos.signals).
    seed: int = 0
    #: replica_freeze: the service whose replica `target` is frozen (lock-server, railproxy).
    service: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        extra = {
            "pause": f"worker slot {self.target}"
            + (" armed (UC-03 hook)" if self.armed else f" for {self.duration_s:.1f}s"),
            "kill": f"worker slot {self.target}",
            "rail_outage": f"for {self.duration_s:.1f}s",
            "lock_server_outage": f"SIGKILL, down {self.duration_s:.1f}s",
            "rail_ambiguity": f"rate {self.level:.2f} for {self.duration_s:.1f}s",
            "slow_lookups": f"visibility delay {self.level:.1f}s for {self.duration_s:.1f}s",
            "rail_slow": f"latency deadline+{self.level:.1f}s for {self.duration_s:.1f}s",
            "clock_skew": f"rail clock {self.level:+.1f}s for {self.duration_s:.1f}s",
            "hostile_signals": "malformed, forged and replayed signals to running payouts",
            "db_failover": "SIGKILL the PostgreSQL primary, promote its synchronous standby",
            "finledger_restart": "SIGKILL the finance ledger, start it on the same book",
            "lock_replica_kill": f"lock-server replica {self.target}, down {self.duration_s:.1f}s",
            "proxy_replica_kill": f"a rail proxy replica mid-forward, down {self.duration_s:.1f}s",
            "publisher_kill": f"outbox publisher {self.target}, down {self.duration_s:.1f}s",
            "replica_freeze": f"{self.service} replica {self.target} for {self.duration_s:.1f}s",
            "etcd_member_kill_frozen": f"etcd leader, lock-server replica {self.target} frozen",
        }.get(self.kind, "")
        return f"#{self.index} t+{self.at_s:.1f}s {self.kind} {extra}".rstrip()


def fault_count(payouts: int) -> int:
    """How many faults a run of this size gets: every kind once, plus one per 100 payouts."""
    return len(FAULT_KINDS) + 1 + min(payouts // 100, 60)


def horizon_s(payouts: int) -> float:
    """The span over which faults are spread: roughly how long the workload runs."""
    return min(max(20.0, payouts * 0.08), 900.0)


def make_schedule(
    seed: int,
    *,
    workers: int,
    payouts: int,
    lock_outage_s: tuple[float, float],
    lease_s: float = 3.0,
    db_failover: bool = False,
    replicas: int = 1,
    backend: str = "postgres",
) -> list[Fault]:
    """The faults of one run, from `random.Random(seed)` only.

    `lock_outage_s` is the run's lock-server outage window (lab.chaos.locks: longer than
    a release's bounded retries, shorter than the session TTL minus a heartbeat, from what the
    run's workers are configured with). The first lock_server_outage lasts the upper half of it,
    the most demanding for any bounded retry; later ones anywhere in it.

    The first fault is always an armed pause at t+0 (the runner arms that worker before it starts
    the workload), so every schedule hits the check-then-act gap at least once: with fencing off
    that guarantees a duplicate movement (the negative control). Every other kind appears at
    least once; the rest are drawn by weight. The first rail_slow and clock_skew come next
    (EARLY_KINDS), while the workload is still submitting. `db_failover` (a primary/standby
    run) adds one db_failover, drawn last, in the first half of the span (while payouts are
    still moving money, so that the promoted node has to carry in-flight work). `replicas` >= 2
    adds each REPLICA_KINDS fault once (and ETCD_REPLICA_KINDS on etcd), drawn after that, in
    the first third of the span.
    """
    if workers < 1:
        raise ScheduleError("a chaos run needs at least one worker")
    if payouts < 1:
        raise ScheduleError("a chaos run needs at least one payout")
    rng = random.Random(seed)
    total = fault_count(payouts)
    kinds: list[FaultKind] = list(FAULT_KINDS)
    population = list(_WEIGHTS)
    weights = [_WEIGHTS[k] for k in population]
    kinds += rng.choices(population, weights=weights, k=total - 1 - len(kinds))
    rng.shuffle(kinds)
    _bring_forward(kinds, EARLY_KINDS)
    span = horizon_s(payouts)
    offsets = sorted(round(rng.uniform(1.0, span), 2) for _ in kinds)
    faults = [Fault(index=0, kind="pause", at_s=0.0, target=rng.randrange(workers), armed=True)]
    low, high = lock_outage_s
    outage = ((low + high) / 2, high)  # the first one; then the whole window
    for i, (kind, at) in enumerate(zip(kinds, offsets, strict=True), start=1):
        if kind == "lock_server_outage":
            faults.append(Fault(i, kind, at, duration_s=round(rng.uniform(*outage), 2)))
            outage = (low, high)
            continue
        faults.append(_draw(rng, i, kind, at, workers=workers, lease_s=lease_s))
    if db_failover:
        faults.append(Fault(0, "db_failover", round(rng.uniform(1.0, max(span / 2, 2.0)), 2)))
    if replicas >= 2:
        kinds = list(REPLICA_KINDS) + (list(ETCD_REPLICA_KINDS) if backend == "etcd" else [])
        faults += [_replica_fault(rng, k, span, replicas=replicas, lease_s=lease_s) for k in kinds]
    faults.sort(key=lambda f: f.at_s)  # stable: #0 stays first
    return [replace(f, index=i) for i, f in enumerate(faults)]


def _replica_fault(
    rng: random.Random, kind: FaultKind, span: float, *, replicas: int, lease_s: float
) -> Fault:
    """One replica fault in the first third of the span (while money moves). A kill's replica
    stays down 1-4 s; a freeze lasts longer than a lease and than every client's timeout (the
    SDKs' 10 s), so the peers and the balancer must carry on without it."""
    at = round(rng.uniform(1.0, max(span / 3, 2.0)), 2)
    target = rng.randrange(replicas)
    if kind == "replica_freeze":
        service = rng.choice(("lock-server", "railproxy"))
        duration = round(max(lease_s, 10.0) + rng.uniform(2.0, 6.0), 2)
        return Fault(0, kind, at, duration_s=duration, target=target, service=service)
    if kind == "etcd_member_kill_frozen":
        return Fault(0, kind, at, target=target, service="lock-server")
    return Fault(0, kind, at, duration_s=round(rng.uniform(1.0, 4.0), 2), target=target)


def _bring_forward(kinds: list[FaultKind], early: tuple[FaultKind, ...]) -> None:
    """Move the first occurrence of each `early` kind to the front, in that order (a swap, so
    the rest of the seeded order stays as drawn)."""
    for pos, kind in enumerate(early):
        first = kinds.index(kind, pos)
        kinds[pos], kinds[first] = kinds[first], kinds[pos]


def _draw(
    rng: random.Random, index: int, kind: FaultKind, at_s: float, *, workers: int, lease_s: float
) -> Fault:
    if kind == "pause":
        armed = rng.random() < 0.3
        # Longer than the lease, so the server expires it and another worker takes over.
        duration = 0.0 if armed else round(lease_s + rng.uniform(1.0, 4.0), 2)
        return Fault(index, kind, at_s, duration, rng.randrange(workers), armed)
    if kind == "kill":
        return Fault(index, kind, at_s, target=rng.randrange(workers))
    if kind == "hostile_signals":
        return Fault(index, kind, at_s, seed=rng.randrange(2**31))
    if kind in _WINDOWS:
        return _window(rng, index, kind, at_s)
    return Fault(index, kind, at_s)  # lock_server_restart, backend_restart, the crash restarts


def _window(rng: random.Random, index: int, kind: FaultKind, at_s: float) -> Fault:
    """A rail behaviour window: its duration, then its level (clock_skew: then its sign)."""
    durations, levels = _WINDOWS[kind]
    duration = round(rng.uniform(*durations), 2)
    if levels is None:
        return Fault(index, kind, at_s, duration_s=duration)
    level = round(rng.uniform(*levels), 2)
    if kind == "clock_skew":
        level *= rng.choice((-1.0, 1.0))  # the rail's clock ahead of ours, or behind
    return Fault(index, kind, at_s, duration_s=duration, level=level)


def kind_counts(faults: list[Fault]) -> dict[str, int]:
    """Faults per kind, every kind present (zeros included), plus any topology kind scheduled."""
    counts: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
    for f in faults:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return counts
