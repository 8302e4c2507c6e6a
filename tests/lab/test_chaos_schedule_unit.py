"""Unit tests of the chaos schedule: a pure function of the seed (no stack, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from lab.chaos.locks import outage_window, workers_outage_window
from lab.chaos.options import CHAOS_LOCK_TTL_S, CHAOS_WORKER_ENV
from lab.chaos.schedule import (
    ETCD_REPLICA_KINDS,
    FAULT_KINDS,
    REPLICA_KINDS,
    Fault,
    ScheduleError,
    horizon_s,
    kind_counts,
)
from lab.chaos.schedule import make_schedule as _make_schedule
from lockservice.sdk import retry_budget_s

#: The chaos run's own lock-server outage window (its workers' TTL and heartbeat, the SDK's
#: retry budget).
WINDOW = workers_outage_window(CHAOS_WORKER_ENV)


def make_schedule(seed: int, **shape: Any) -> list[Fault]:
    return _make_schedule(seed, lock_outage_s=WINDOW, **shape)


def test_same_seed_gives_the_same_schedule() -> None:
    """Two schedules built from one seed (and one run shape) are equal, fault for fault."""
    a = make_schedule(42, workers=3, payouts=500)
    b = make_schedule(42, workers=3, payouts=500)
    assert [f.as_dict() for f in a] == [f.as_dict() for f in b]


def test_different_seeds_give_different_schedules() -> None:
    """Two seeds give two different schedules (kinds, offsets or parameters differ)."""
    a = make_schedule(1, workers=2, payouts=100)
    b = make_schedule(2, workers=2, payouts=100)
    assert [f.as_dict() for f in a] != [f.as_dict() for f in b]


@pytest.mark.parametrize("seed", range(25))
def test_every_schedule_starts_with_an_armed_pause_and_covers_every_kind(seed: int) -> None:
    """Fault #0 is an armed pause at t+0 and every fault kind appears at least once."""
    faults = make_schedule(seed, workers=2, payouts=25)
    assert faults[0].kind == "pause" and faults[0].armed and faults[0].at_s == 0.0
    counts = kind_counts(faults)
    assert set(counts) == set(FAULT_KINDS)
    assert all(n >= 1 for n in counts.values()), counts


@pytest.mark.parametrize("seed", range(25))
def test_faults_are_ordered_and_plain_pauses_outlast_the_lease(seed: int) -> None:
    """Offsets never go back, targets name a worker slot, and a plain pause exceeds the lease."""
    faults = make_schedule(seed, workers=3, payouts=300, lease_s=3.0)
    offsets = [f.at_s for f in faults]
    assert offsets == sorted(offsets)
    assert [f.index for f in faults] == list(range(len(faults)))
    for f in faults:
        assert 0 <= f.target < 3
        if f.kind == "pause" and not f.armed:
            assert f.duration_s > 3.0
        if f.kind in ("rail_outage", "rail_ambiguity", "slow_lookups", "rail_slow", "clock_skew"):
            assert f.duration_s > 0
        if f.kind == "rail_slow":
            assert f.level > 0  # beyond the submit deadline, never inside it
        if f.kind == "clock_skew":
            assert 2.0 <= abs(f.level) <= 30.0


def test_larger_runs_get_more_faults() -> None:
    """The fault count grows with the workload (one more per 100 payouts)."""
    assert len(make_schedule(1, workers=2, payouts=2000)) > len(
        make_schedule(1, workers=2, payouts=25)
    )


def test_a_run_without_workers_or_payouts_is_refused() -> None:
    """No worker to pause or no payout to run is a ScheduleError, not an empty schedule."""
    with pytest.raises(ScheduleError):
        make_schedule(1, workers=0, payouts=10)
    with pytest.raises(ScheduleError):
        make_schedule(1, workers=1, payouts=0)


@pytest.mark.parametrize("seed", range(25))
def test_a_300_payout_run_schedules_every_kind_including_the_new_ones(seed: int) -> None:
    """Issue 12: a 300-payout run schedules each kind at least once, the crash restarts of
    Temporal and the rail stub, the slow rail and the clock skew included."""
    counts = kind_counts(make_schedule(seed, workers=3, payouts=300))
    assert list(counts) == list(FAULT_KINDS)
    assert {"temporal_restart", "rail_restart", "rail_slow", "clock_skew"} <= set(counts)
    assert all(n >= 1 for n in counts.values()), counts


def test_kind_counts_lists_every_kind_with_zeros() -> None:
    """A schedule without some kinds still reports them, at zero."""
    faults = make_schedule(5, workers=2, payouts=25)[:1]  # only the armed pause
    counts = kind_counts(faults)
    assert counts["pause"] == 1
    assert set(counts) == set(FAULT_KINDS) and sum(counts.values()) == 1


def test_clock_skew_goes_both_ways_across_seeds() -> None:
    """The skew's sign is seeded: some runs put the rail's clock ahead of ours, some behind."""
    levels = [
        f.level
        for seed in range(40)
        for f in make_schedule(seed, workers=2, payouts=25)
        if f.kind == "clock_skew"
    ]
    assert any(v > 0 for v in levels) and any(v < 0 for v in levels)


@pytest.mark.parametrize("payouts", [25, 300, 2000])
def test_the_slow_rail_and_the_clock_skew_come_first_after_the_armed_pause(payouts: int) -> None:
    """A rail slower than the deadline only bites while payouts are still being submitted, so
    its first window (then the first skew) fires right after fault #0, in every run size."""
    for seed in range(10):
        faults = make_schedule(seed, workers=2, payouts=payouts)
        assert [f.kind for f in faults[1:3]] == ["rail_slow", "clock_skew"]


@pytest.mark.parametrize("seed", range(25))
def test_lock_server_outages_fall_inside_the_window_the_first_in_its_upper_half(seed: int) -> None:
    """Every lock-server outage lasts longer than a release's bounded retries and shorter than
    the session TTL minus a heartbeat; the first one in the upper half (the most demanding for
    any bounded retry)."""
    low, high = WINDOW
    outages = [
        f for f in make_schedule(seed, workers=2, payouts=300) if f.kind == "lock_server_outage"
    ]
    assert outages, "every run has one"
    assert all(low <= f.duration_s <= high for f in outages)
    assert outages[0].duration_s >= (low + high) / 2


def test_the_outage_window_follows_the_sdk_retries_and_the_runs_lease() -> None:
    """Derived, not configured: the SDK's retry budget + margin up to TTL - heartbeat - margin;
    the chaos run's lease leaves room for the issue's 6-8 s outages; no window, no run."""
    hb = float(CHAOS_WORKER_ENV["WORKER_LOCK_HEARTBEAT_S"])
    assert (round(retry_budget_s() + 0.5, 2), round(CHAOS_LOCK_TTL_S - hb - 0.5, 2)) == WINDOW
    assert WINDOW[0] < 6.0 and WINDOW[1] > 8.0
    assert outage_window(ttl_s=15, heartbeat_s=5, budget_s=0.7) == (1.2, 9.5)
    with pytest.raises(ValueError, match="no lock-server outage window"):
        outage_window(ttl_s=3, heartbeat_s=0.75, budget_s=2.0)


@pytest.mark.parametrize("seed", range(10))
def test_a_primary_standby_run_adds_one_db_failover_and_keeps_the_rest(seed: int) -> None:
    """`db_failover=True` adds exactly one db_failover, in the first half of the span, and the
    other faults are those of the same seed without it (same kinds, offsets and parameters)."""
    plain = make_schedule(seed, workers=2, payouts=25)
    ha = make_schedule(seed, workers=2, payouts=25, db_failover=True)
    failovers = [f for f in ha if f.kind == "db_failover"]
    assert len(failovers) == 1 and 1.0 <= failovers[0].at_s <= horizon_s(25) / 2
    strip = [{**f.as_dict(), "index": 0} for f in ha if f.kind != "db_failover"]
    assert strip == [{**f.as_dict(), "index": 0} for f in plain]
    assert [f.index for f in ha] == list(range(len(ha))) and ha[0].armed
    assert [f.at_s for f in ha] == sorted(f.at_s for f in ha)
    assert kind_counts(ha)["db_failover"] == 1 and "db_failover" not in kind_counts(plain)


@pytest.mark.parametrize("backend", ["postgres", "etcd"])
@pytest.mark.parametrize("seed", range(10))
def test_a_replicated_run_adds_each_replica_fault_once_and_keeps_the_rest(
    seed: int, backend: str
) -> None:
    """Issue 26 §3: `replicas` >= 2 adds every replica kind once (and on etcd the member kill
    under a frozen replica), in the first third of the span, aimed at an existing replica; a
    freeze outlasts the lease and the SDKs' 10 s timeouts. The rest is the seed's plain run."""
    plain = make_schedule(seed, workers=2, payouts=25, db_failover=True, lease_s=CHAOS_LOCK_TTL_S)
    rep = make_schedule(
        seed,
        workers=2,
        payouts=25,
        db_failover=True,
        lease_s=CHAOS_LOCK_TTL_S,
        replicas=2,
        backend=backend,
    )
    expected = [*REPLICA_KINDS, *(ETCD_REPLICA_KINDS if backend == "etcd" else ())]
    added = [f for f in rep if f.kind in expected]
    assert sorted(f.kind for f in added) == sorted(expected)
    assert all(1.0 <= f.at_s <= horizon_s(25) / 3 and 0 <= f.target < 2 for f in added)
    freeze = next(f for f in added if f.kind == "replica_freeze")
    assert freeze.service in ("lock-server", "railproxy")
    assert freeze.duration_s > max(CHAOS_LOCK_TTL_S, 10.0)
    strip = [{**f.as_dict(), "index": 0} for f in rep if f.kind not in expected]
    assert strip == [{**f.as_dict(), "index": 0} for f in plain]
    assert [f.index for f in rep] == list(range(len(rep))) and rep[0].armed
    counts = kind_counts(rep)
    assert all(counts[k] == 1 for k in expected)
    assert "lock_replica_kill" not in kind_counts(plain)


def test_every_run_restarts_the_finance_ledger() -> None:
    """The ledger's restart is no topology kind: every schedule has it."""
    assert "finledger_restart" in FAULT_KINDS
    assert kind_counts(make_schedule(3, workers=2, payouts=25))["finledger_restart"] >= 1
