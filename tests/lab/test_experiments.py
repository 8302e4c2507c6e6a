"""The UC-03 pause and UC-04 crash experiments, run on the real local stack for both lock
backends at a small size. Each run starts its own stack on free ports.

The six runs run side by side (`experiments`), one stack each, in one event loop: a run is
mostly waiting (for a lease to expire, for the next holder, for recovery), and each decides its
outcome from its own stack's evidence, never from the clock; within one process `free_port`
never hands out a port twice, so the stacks cannot collide.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lab.experiments.crash import crash_experiment
from lab.experiments.harness import default_config
from lab.experiments.pause import pause_experiment
from stack.config import StackConfig
from tests.stack.conftest import external_database

pytestmark = pytest.mark.slow

#: Each run: its name, its backend, and the experiment on that stack's config.
Run = Callable[[StackConfig, Path], Awaitable[dict[str, Any]]]
RUNS: dict[str, tuple[str, Run]] = {
    "pause-on-postgres": (
        "postgres",
        lambda cfg, ev: pause_experiment(cfg, fencing=True, evidence_dir=ev),
    ),
    "pause-on-etcd": ("etcd", lambda cfg, ev: pause_experiment(cfg, fencing=True, evidence_dir=ev)),
    "pause-off-postgres": (
        "postgres",
        lambda cfg, ev: pause_experiment(cfg, fencing=False, evidence_dir=ev),
    ),
    "crash-CLAIMED": (
        "postgres",
        lambda cfg, ev: crash_experiment(cfg, at="CLAIMED", evidence_dir=ev),
    ),
    "crash-RAIL_SUBMITTED": (
        "postgres",
        lambda cfg, ev: crash_experiment(cfg, at="RAIL_SUBMITTED", evidence_dir=ev),
    ),
    "crash-RAIL_ACKED": (
        "etcd",
        lambda cfg, ev: crash_experiment(cfg, at="RAIL_ACKED", evidence_dir=ev),
    ),
}


async def _one(name: str, run_dir: Path) -> tuple[dict[str, Any], Path]:
    backend, experiment = RUNS[name]
    cfg = default_config(backend, run_dir / f"exp-{name}-{uuid.uuid4().hex[:6]}")
    evidence = run_dir / f"ev-{name}-{uuid.uuid4().hex[:6]}"
    async with external_database(prefix="exp") as url:  # on $DATABASE_URL's server, if set
        return await experiment(replace(cfg, database_url=url) if url else cfg, evidence), evidence


@pytest.fixture(scope="module")
def experiments(run_dir: Path) -> Iterator[dict[str, tuple[dict[str, Any], Path]]]:
    """Every run's result and evidence directory, by name; all six run at once."""

    async def all_runs() -> dict[str, tuple[dict[str, Any], Path]]:
        names = list(RUNS)
        results = await asyncio.gather(*(_one(n, run_dir) for n in names))
        return dict(zip(names, results, strict=True))

    yield asyncio.run(all_runs())


@pytest.mark.parametrize("backend", ["postgres", "etcd"])
def test_pause_with_fencing_on_is_fenced_out(
    experiments: dict[str, tuple[dict[str, Any], Path]], backend: str
) -> None:
    """UC-03: W1 frozen past its lease is refused at the proxy and at the payment database;
    exactly one rail movement, the ledger balanced, one fenced-out event, T2 > T1."""
    result, evidence = experiments[f"pause-on-{backend}"]
    assert result["checks"] and all(result["checks"].values()), result
    assert result["rail_movements"] == 1 and result["fenced_out_events"] == 1
    assert result["t2"] > result["t1"]
    assert (evidence / "rail_movements.json").exists()


def test_pause_with_fencing_off_pays_twice(
    experiments: dict[str, tuple[dict[str, Any], Path]],
) -> None:
    """The FR-29 negative control: the same run with fencing off moves the money twice."""
    result, _ = experiments["pause-off-postgres"]
    assert result["rail_movements"] == 2, result
    assert result["rail_debited"] == 2 * result["amount"]
    assert result["fenced_out_events"] == 0


@pytest.mark.parametrize("at", ["CLAIMED", "RAIL_SUBMITTED", "RAIL_ACKED"])
def test_crash_recovers_by_state(
    experiments: dict[str, tuple[dict[str, Any], Path]], at: str
) -> None:
    """UC-04: a worker SIGKILLed at CLAIMED, RAIL_SUBMITTED or RAIL_ACKED is recovered by the
    next holder from the state and the proxy's record (RAIL_ACKED on the etcd backend, the
    others on PostgreSQL): one rail movement, posted once."""
    result, _ = experiments[f"crash-{at}"]
    assert result["checks"] and all(result["checks"].values()), result
    assert result["state_at_crash"] == at
    if at == "RAIL_SUBMITTED":
        assert "RAIL_AMBIGUOUS" in result["states"]
