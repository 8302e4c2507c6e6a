"""Unit tests of the chaos summary: counts, availability and verdict from given evidence."""

from __future__ import annotations

from typing import Any

from lab.chaos.summary import (
    Evidence,
    availability,
    duplicate_movements,
    summarize,
    verdict,
)


def _evidence(**overrides: Any) -> Evidence:
    base: dict[str, Any] = {
        "seed": 3,
        "backend": "postgres",
        "fencing": True,
        "payouts": 4,
        "accounts": 2,
        "workers": 2,
        "states": ["POSTED", "POSTED", "FAILED", "RAIL_AMBIGUOUS"],
        "movement_references": ["po-1", "po-2", "po-4"],
        "events": {
            "lock-server": [
                {"event": "lock.acquired", "key": "payout:a1", "token": 1},
                {"event": "lock.acquired", "key": "payout:a2", "token": 1},
                {"event": "lock.acquired", "key": "chaos:probe-1", "token": 1},
                {"event": "lock.not_acquired", "key": "payout:a1", "reason": "held"},
            ],
            "worker-1": [
                {"event": "lock.acquire_unavailable", "key": "payout:a1"},
                {"event": "lock.fenced_out", "presented_token": 1},
                {"event": "lock.idle_lease_released", "key": "payout:a2", "token": 1},
            ],
            "railproxy": [{"event": "lock.fenced_out", "presented_token": 1}],
        },
        "invariant_counts": dict.fromkeys([f"INV-{i:02d}" for i in range(1, 11)], 0),
        "reconcile_counts": {"duplicate_submission": 0},
        "faults_fired": [{"kind": "pause"}, {"kind": "kill"}, {"kind": "pause"}],
        "schedule": [],
        "elapsed_s": 12.34,
        "settled": True,
    }
    base.update(overrides)
    return Evidence(**base)


def test_duplicate_movements_counts_references_with_more_than_one_movement() -> None:
    """A reference seen twice or three times counts once; single movements do not count."""
    assert duplicate_movements(["a", "b", "a", "c", "c", "c"]) == 2
    assert duplicate_movements([]) == 0


def test_availability_excludes_held_by_another_and_probe_keys() -> None:
    """Ratio = payout grants / (payout grants + unavailable); 'held' and probe grants are out."""
    a = availability(_evidence().events)
    assert a["acquire_granted"] == 2
    assert a["acquire_unavailable"] == 1
    assert a["acquire_success_ratio"] == round(2 / 3, 6)
    assert availability({})["acquire_success_ratio"] is None


def test_verdict_with_fencing_on_fails_on_any_violation() -> None:
    """Fencing on: exit 0 only with zero violations."""
    assert verdict(True, 0)[0] == 0
    assert verdict(True, 1)[0] == 1


def test_verdict_with_fencing_off_is_the_negative_control() -> None:
    """Fencing off: exit 0 when violations were found, 1 when the harness saw none."""
    code, text = verdict(False, 2)
    assert code == 0 and "negative control" in text
    assert verdict(False, 0)[0] == 1


def test_summary_has_every_required_field() -> None:
    """The summary carries the issue's fields with counts computed from the evidence."""
    s = summarize(_evidence())
    assert s["seed"] == 3 and s["payouts"] == 4
    assert s["terminal"] == 3 and s["ambiguous_open"] == 1
    assert s["faults"]["pause"] == 2 and s["faults"]["kill"] == 1
    assert s["faults"]["rail_outage"] == 0
    assert list(s["violations"]) == [f"INV-{i:02d}" for i in range(1, 11)]
    assert s["fenced_out"] == 2
    assert s["leaked_grants_released"] == {
        "orphan": 0,
        "idle": 1,
        "undelivered": 0,
        "pending_then_released": 0,
    }
    assert s["releases_pending"] == 0 and s["held_payout_locks"] == 0
    assert s["lock_server_outages"] == []
    assert s["duplicate_movements"] == 0
    assert s["reconcile"] == {"duplicate_submission": 0}
    assert s["elapsed_s"] == 12.3
    assert s["exit_code"] == 0
    for key in ("availability", "verdict", "schedule", "settled"):
        assert key in s


def test_summary_reports_violations_and_leader_changes() -> None:
    """Violations fail a fencing-on run; etcd leader-change windows are listed."""
    counts = dict.fromkeys([f"INV-{i:02d}" for i in range(1, 11)], 0) | {"INV-02": 2}
    s = summarize(
        _evidence(
            backend="etcd",
            invariant_counts=counts,
            movement_references=["po-1", "po-1"],
            leader_changes=[{"old_leader": "m0", "new_leader": "m1", "unavailable_s": 1.2}],
        )
    )
    assert s["violations_total"] == 2 and s["exit_code"] == 1
    assert s["duplicate_movements"] == 1
    assert s["availability"]["etcd_unavailable_s"] == [1.2]


def test_every_fault_kind_and_invariant_is_listed_with_zeros() -> None:
    """The JSON lists every fault kind (the new ones of issue 12 too) and INV-01..INV-10, zeros
    included; evidence without INV-09/INV-10 counts (an older checker) still lists them at 0."""
    from lab.chaos.schedule import FAULT_KINDS

    s = summarize(_evidence(invariant_counts={"INV-02": 0}))
    assert list(s["faults"]) == list(FAULT_KINDS)
    for kind in ("temporal_restart", "rail_restart", "rail_slow", "clock_skew"):
        assert s["faults"][kind] == 0
    assert s["violations"] == {f"INV-{i:02d}": 0 for i in range(1, 11)}


def test_new_invariants_count_in_the_total_and_fail_the_run() -> None:
    """An INV-09 or INV-10 violation is a violation like the others: total and exit status."""
    counts = dict.fromkeys([f"INV-{i:02d}" for i in range(1, 11)], 0) | {"INV-09": 3, "INV-10": 1}
    s = summarize(
        _evidence(
            invariant_counts=counts,
            invariants_not_checked=[],
            workers_replaced=[{"worker": "worker-1", "replacement": "worker-3", "cause": "x"}],
        )
    )
    assert s["violations_total"] == 4 and s["exit_code"] == 1
    assert s["workers_replaced"][0]["replacement"] == "worker-3"
    assert s["invariants_not_checked"] == []
