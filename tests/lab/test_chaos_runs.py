"""Small seeded chaos runs on the real local stack (issue 7, STD01-13/14): one per backend with
fencing on (every invariant must hold), and the fencing-off negative control (it must not).

Each run starts its own stack on free ports, so these never collide with `payouts up`. The two
fencing-on runs run side by side in one event loop (`fencing_on_runs`), each on its own stack:
most of a run is waiting (for the rail's records to reach past the skew margin, for leases to
expire, for ambiguous payouts to be resolved), so together they take little longer than one; a
busier machine changes when faults land, never whether an invariant may break.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.chaos import ChaosOptions, run_chaos
from lab.chaos_schedule import FAULT_KINDS

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Settling is judged on progress (no payout may go 120 s without any state change); a loaded
# 2-core CI machine drains the last payouts slowly, and the run still has to settle completely
# (asserted below). The cap only bounds a run that keeps changing state forever.
SMALL = {"payouts": 25, "accounts": 5, "workers": 2, "settle_timeout_s": 600.0}


def _assert_ran_every_fault(summary: dict[str, object]) -> None:
    faults = summary["faults"]
    assert isinstance(faults, dict)
    missing = [k for k in FAULT_KINDS if faults.get(k, 0) < 1]
    assert not missing, f"faults never fired: {missing}"


@pytest.fixture(scope="module")
def fencing_on_runs(run_dir: Path) -> Iterator[dict[str, dict[str, Any]]]:
    """One seeded run per backend with fencing on, both at once; their summaries by backend."""

    async def both() -> list[dict[str, Any]]:
        runs = []
        for backend in ("postgres", "etcd"):
            where = run_dir / f"chaos-{backend}-{uuid.uuid4().hex[:6]}"
            where.mkdir(mode=0o755)  # the embedded PostgreSQL runs unprivileged
            runs.append(run_chaos(ChaosOptions(**SMALL, seed=11, backend=backend, run_dir=where)))
        return list(await asyncio.gather(*runs))

    postgres, etcd = asyncio.run(both())
    yield {"postgres": postgres, "etcd": etcd}


def test_postgres_run_with_fencing_on_keeps_every_invariant(
    fencing_on_runs: dict[str, dict[str, Any]],
) -> None:
    """Under every fault kind on the PostgreSQL backend (Temporal and rail stub crashes, a rail
    slower than the submit deadline and rail clock skew included), INV-01..INV-10 count zero."""
    summary = fencing_on_runs["postgres"]
    _assert_ran_every_fault(summary)
    assert summary["violations"] == {f"INV-{i:02d}": 0 for i in range(1, 11)}, summary[
        "violation_samples"
    ]
    assert summary["duplicate_movements"] == 0
    assert summary["exit_code"] == 0
    assert summary["terminal"] + summary["ambiguous_open"] == SMALL["payouts"]
    assert summary["faults_fired"][0]["triggered"] is True  # the armed pause hit the gap


def test_etcd_run_with_fencing_on_keeps_every_invariant(
    fencing_on_runs: dict[str, dict[str, Any]],
) -> None:
    """On the etcd backend (3 members, leader killed), INV-01..INV-10 all count zero and each
    leader change has a measured unavailability window."""
    summary = fencing_on_runs["etcd"]
    _assert_ran_every_fault(summary)
    assert summary["violations"] == {f"INV-{i:02d}": 0 for i in range(1, 11)}, summary[
        "violation_samples"
    ]
    assert summary["exit_code"] == 0
    changes = summary["availability"]["etcd_leader_changes"]
    assert changes and all(c["recovered"] and c["unavailable_s"] > 0 for c in changes)
    assert all(c["new_leader"] not in (None, c["old_leader"]) for c in changes)


def test_fencing_off_run_shows_violations_through_the_cli(stack_dir: Path) -> None:
    """The negative control: the same kind of seeded run with fencing off reports duplicate
    movements (INV-02), exits 0 for "violations found as expected", and prints JSON last."""
    argv = [sys.executable, "-m", "payouts.cli", "chaos", "--seed", "11", "--fencing", "off"]
    argv += ["--payouts", "25", "--accounts", "5", "--workers", "2", "--json"]
    argv += ["--run-dir", str(stack_dir)]
    proc = subprocess.run(
        argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=280, check=False
    )
    last = proc.stdout.strip().splitlines()[-1]
    summary = json.loads(last)
    assert summary["fencing"] == "off" and summary["negative_control"] is True
    assert summary["violations"]["INV-02"] > 0, summary["faults_fired"][0]
    assert summary["duplicate_movements"] > 0
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "negative control" in summary["verdict"]
