"""The UC-03 pause and UC-04 crash experiments, run on the real local stack for both lock
backends at a small size. Each run starts its own stack on free ports."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from lab.experiments import crash_experiment, default_config, pause_experiment
from stack.config import StackConfig

pytestmark = pytest.mark.slow


@pytest.fixture
def config(run_dir: Path, request: pytest.FixtureRequest) -> Iterator[StackConfig]:
    backend = request.param
    cfg = default_config(backend, run_dir / f"exp-{uuid.uuid4().hex[:6]}")
    if os.environ.get("DATABASE_URL"):
        # An external server: the stack uses it; give the run a database of its own.
        import asyncio

        from common.pgutil import create_database, drop_database

        url = asyncio.run(create_database(os.environ["DATABASE_URL"]))
        yield replace(cfg, database_url=url)
        asyncio.run(drop_database(os.environ["DATABASE_URL"], url))
    else:
        yield cfg


@pytest.mark.parametrize("config", ["postgres", "etcd"], indirect=True)
async def test_pause_with_fencing_on_is_fenced_out(config: StackConfig, run_dir: Path) -> None:
    """UC-03: W1 frozen past its lease is refused at the proxy and at the payment database;
    exactly one rail movement, the ledger balanced, one fenced-out event, T2 > T1."""
    result = await pause_experiment(config, fencing=True, evidence_dir=run_dir / "ev-on")
    assert result["checks"] and all(result["checks"].values()), result
    assert result["rail_movements"] == 1 and result["fenced_out_events"] == 1
    assert result["t2"] > result["t1"]
    assert (run_dir / "ev-on" / "rail_movements.json").exists()


@pytest.mark.parametrize("config", ["postgres"], indirect=True)
async def test_pause_with_fencing_off_pays_twice(config: StackConfig, run_dir: Path) -> None:
    """The FR-29 negative control: the same run with fencing off moves the money twice."""
    result = await pause_experiment(config, fencing=False, evidence_dir=run_dir / "ev-off")
    assert result["rail_movements"] == 2, result
    assert result["rail_debited"] == 2 * result["amount"]
    assert result["fenced_out_events"] == 0


@pytest.mark.parametrize(
    ("config", "at"),
    [("postgres", "CLAIMED"), ("postgres", "RAIL_SUBMITTED"), ("etcd", "RAIL_ACKED")],
    indirect=["config"],
)
async def test_crash_recovers_by_state(config: StackConfig, at: str, run_dir: Path) -> None:
    """UC-04: a worker SIGKILLed at CLAIMED, RAIL_SUBMITTED or RAIL_ACKED is recovered by the
    next holder from the state and the proxy's record: one rail movement, posted once."""
    result = await crash_experiment(config, at=at, evidence_dir=run_dir / f"ev-crash-{at}")
    assert result["checks"] and all(result["checks"].values()), result
    assert result["state_at_crash"] == at
    if at == "RAIL_SUBMITTED":
        assert "RAIL_AMBIGUOUS" in result["states"]
