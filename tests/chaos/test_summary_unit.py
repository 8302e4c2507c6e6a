"""Unit tests of the chaos summary: counts, availability and verdict from given evidence."""

from __future__ import annotations

from typing import Any

from payouts.chaos_summary import (
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
        "invariant_counts": dict.fromkeys([f"INV-0{i}" for i in range(1, 9)], 0),
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
    assert list(s["violations"]) == [f"INV-0{i}" for i in range(1, 9)]
    assert s["fenced_out"] == 2
    assert s["leaked_grants_released"] == {"orphan": 0, "idle": 1}
    assert s["duplicate_movements"] == 0
    assert s["reconcile"] == {"duplicate_submission": 0}
    assert s["elapsed_s"] == 12.3
    assert s["exit_code"] == 0
    for key in ("availability", "verdict", "schedule", "settled"):
        assert key in s


def test_summary_reports_violations_and_leader_changes() -> None:
    """Violations fail a fencing-on run; etcd leader-change windows are listed."""
    counts = dict.fromkeys([f"INV-0{i}" for i in range(1, 9)], 0) | {"INV-02": 2}
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
