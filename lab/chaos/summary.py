"""The chaos run's summary: pure computations over the evidence a run collected (issue 7).

Owns: the JSON summary's fields (`seed`, `payouts`, `terminal`, `ambiguous_open`, `faults`,
`violations`, `fenced_out`, `duplicate_movements`, `reconcile`, `availability`, `elapsed_s`, ...),
the availability ratio, and the verdict and exit status. Must never: perform I/O; the runner
(lab.chaos.run) gathers the evidence and hands it over.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.lockkey import PAYOUT_KEY_PREFIX
from invariants.rules import INVARIANTS

TERMINAL = frozenset({"POSTED", "FAILED", "ABANDONED"})

#: Events counted for availability (NFR-01/NFR-02). A grant is logged by the lock server's
#: backend; a worker logs an acquire that failed because the lock service was unreachable or its
#: backend down. "Held by another" (`lock.not_acquired`) is neither: it is the lock working.
ACQUIRED_EVENT = "lock.acquired"
UNAVAILABLE_EVENT = "lock.acquire_unavailable"
FENCED_OUT_EVENT = "lock.fenced_out"
#: Only payout locks count: the runner's own probe grants (key "chaos:...") are not workload.


@dataclass
class Evidence:
    """What one run observed, gathered by the runner after the system settled."""

    seed: int
    backend: str
    fencing: bool
    payouts: int
    accounts: int
    workers: int
    states: Sequence[str]  # one per payout of the run
    movement_references: Sequence[str]  # client_reference of every rail movement
    events: Mapping[str, Sequence[Mapping[str, Any]]]  # service log name -> JSON events
    invariant_counts: Mapping[str, int]
    reconcile_counts: Mapping[str, int]
    faults_fired: Sequence[Mapping[str, Any]]  # one record per fault, with "kind"
    schedule: Sequence[Mapping[str, Any]]
    elapsed_s: float
    settled: bool
    leader_changes: Sequence[Mapping[str, Any]] = field(default_factory=list)
    invariant_samples: Mapping[str, Sequence[str]] = field(default_factory=dict)
    invariants_not_checked: Sequence[str] = field(default_factory=list)
    #: Slot workers that exited by themselves (e.g. when Temporal vanished) and were replaced.
    workers_replaced: Sequence[Mapping[str, Any]] = field(default_factory=list)
    #: Payout locks still held by live sessions when the checker ran (INV-10 judges them).
    held_payout_locks: int = 0
    #: The outbox against the finance ledger's book (lab.chaos.downstream).
    downstream: Mapping[str, Any] = field(default_factory=dict)
    #: Replicas per service and the PostgreSQL standby the run ran on.
    topology: Mapping[str, Any] = field(default_factory=dict)


def duplicate_movements(references: Iterable[str]) -> int:
    """Rail client references with more than one movement: a payout that moved money twice."""
    return sum(1 for n in Counter(references).values() if n > 1)


def count_events(events: Mapping[str, Sequence[Mapping[str, Any]]], name: str) -> int:
    return sum(1 for evs in events.values() for e in evs if e.get("event") == name)


def availability(events: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Acquire success ratio excluding "held by another": grants / (grants + unavailable)."""
    granted = sum(
        1
        for evs in events.values()
        for e in evs
        if e.get("event") == ACQUIRED_EVENT and str(e.get("key", "")).startswith(PAYOUT_KEY_PREFIX)
    )
    unavailable = count_events(events, UNAVAILABLE_EVENT)
    attempts = granted + unavailable
    return {
        "acquire_granted": granted,
        "acquire_unavailable": unavailable,
        "acquire_success_ratio": round(granted / attempts, 6) if attempts else None,
    }


def fault_counts(fired: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    from lab.chaos.schedule import FAULT_KINDS

    counts: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
    for f in fired:
        counts[str(f["kind"])] = counts.get(str(f["kind"]), 0) + 1
    return counts


def lock_server_outages(fired: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each lock-server outage as measured (kill to healthy), against the run's window."""
    return [
        {k: f.get(k) for k in ("planned_s", "outage_s", "window_s", "in_window")}
        for f in fired
        if f.get("kind") == "lock_server_outage"
    ]


def downstream_problems(counts: Mapping[str, Any]) -> int:
    """What fails a fencing-on run downstream (lab.chaos.downstream's counts): postings lost,
    doubled, invented or never delivered."""
    if not counts.get("checked"):
        return 0
    keys = ("missing", "booked_twice", "unknown", "pending", "dead_letter")
    return sum(int(counts[k]) for k in keys)


def verdict(fencing: bool, violations_total: int, downstream: int = 0) -> tuple[int, str]:
    """Exit status and a one-line verdict.

    Fencing on: 0 only when every invariant holds and every posting reached the finance ledger
    exactly once (`downstream` problems: lab.chaos.downstream). Fencing off is the negative
    control (FR-29, NFR-07): it must SHOW violations, so 0 when it does and 1 when the harness
    saw nothing.
    """
    if fencing:
        if violations_total == 0 and downstream == 0:
            return 0, "OK: fencing on, every invariant held under the injected faults"
        if violations_total == 0:
            return 1, f"FAIL: fencing on, {downstream} posting(s) not delivered exactly once"
        return 1, f"FAIL: fencing on, {violations_total} invariant violation(s)"
    if violations_total > 0:
        return 0, (
            f"OK (negative control): fencing off, {violations_total} violation(s) found as "
            "expected; the harness sees what fencing prevents"
        )
    return 1, "FAIL (negative control): fencing off but no violation was found"


def summarize(ev: Evidence) -> dict[str, Any]:
    """The summary object printed as the last line with --json."""
    by_state = Counter(ev.states)
    violations = {inv: int(ev.invariant_counts.get(inv, 0)) for inv in INVARIANTS}
    total = sum(violations.values())
    code, text = verdict(ev.fencing, total, downstream_problems(dict(ev.downstream)))
    still_open = sum(
        n for st, n in by_state.items() if st not in TERMINAL and st != "RAIL_AMBIGUOUS"
    )
    if not ev.settled:
        # The invariants were still checked over everything that happened; say the run is partial.
        text += f" (WARNING: did not settle within the budget; {still_open} payout(s) still open)"
    avail = availability(ev.events)
    avail["etcd_leader_changes"] = [dict(c) for c in ev.leader_changes]
    avail["etcd_unavailable_s"] = [
        c.get("unavailable_s") for c in ev.leader_changes if "unavailable_s" in c
    ]
    return {
        "seed": ev.seed,
        "backend": ev.backend,
        "fencing": "on" if ev.fencing else "off",
        "negative_control": not ev.fencing,
        "payouts": ev.payouts,
        "accounts": ev.accounts,
        "workers": ev.workers,
        "topology": dict(ev.topology),
        "terminal": sum(n for s, n in by_state.items() if s in TERMINAL),
        "ambiguous_open": by_state.get("RAIL_AMBIGUOUS", 0),
        "states": dict(sorted(by_state.items())),
        "settled": ev.settled,
        "faults": fault_counts(ev.faults_fired),
        "violations": violations,
        "violations_total": total,
        "violation_samples": {k: list(v) for k, v in ev.invariant_samples.items() if v},
        "invariants_not_checked": list(ev.invariants_not_checked),
        "fenced_out": count_events(ev.events, FENCED_OUT_EVENT),
        # Grants released because nobody was going to (liveness aids, see the README): how
        # often an acquire's answer was lost, or a workflow moved on from its grant.
        "leaked_grants_released": {
            "orphan": count_events(ev.events, "lock.orphan_released"),
            "idle": count_events(ev.events, "lock.idle_lease_released"),
            # the workflow never received the acquire's answer (Temporal said NOT_FOUND)
            "undelivered": count_events(ev.events, "lock.grant_undelivered"),
            # a release the lock server did not answer, completed later by the SDK
            "pending_then_released": count_events(ev.events, "lock.release_recovered"),
        },
        # Releases owed to the lock server, and what is left held at the end (issue 24 item 6).
        "releases_pending": count_events(ev.events, "lock.release_pending"),
        "held_payout_locks": ev.held_payout_locks,
        "lock_server_outages": lock_server_outages(ev.faults_fired),
        "duplicate_movements": duplicate_movements(ev.movement_references),
        "workers_replaced": [dict(w) for w in ev.workers_replaced],
        "reconcile": dict(ev.reconcile_counts),
        "downstream": dict(ev.downstream),
        "availability": avail,
        "elapsed_s": round(ev.elapsed_s, 1),
        "schedule": list(ev.schedule),
        "faults_fired": list(ev.faults_fired),
        "exit_code": code,
        "verdict": text,
    }
