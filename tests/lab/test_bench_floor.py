"""`make bench-floor` (`python -m lab.bench.floor`) run tiny as a real subprocess on its own
real Temporal dev servers (the default transfer-queue read rate and a raised one): both shapes
complete every workflow of every shape and the last line is one JSON object with their figures. No timing is
asserted (the machine is shared); only that each figure was measured."""

from __future__ import annotations

import asyncio
import json
import sys


async def test_bench_floor_runs_both_shapes_and_prints_json_last() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "lab.bench.floor", "--n", "3", "--rounds", "1", "--workers", "1"),
        *("--serial", "2"),
        *("--transfer-rps", "20,100"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert (result["n"], result["workers"]) == (3, 1)
    for rps in ("20", "100"):
        figures = result[f"transfer_rps_{rps}"]
        # Counted from each burst's histories: the shapes take the tasks they are built for.
        assert figures["baseline_floor"]["workflow_tasks"] == 6
        assert figures["floor"]["workflow_tasks"] == 3
        assert figures["merged_floor"]["workflow_tasks"] == 4
        for shape in ("baseline_floor", "floor", "merged_floor"):
            stats = figures[shape]
            assert stats["throughput_per_s"] > 0 and 0 < stats["p50_ms"] <= stats["p99_ms"]
            assert stats["serial_p50_ms"] > 0


async def test_bench_floor_refuses_bad_sizes_in_one_line() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "lab.bench.floor", "--n", "0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "must be at least 1" in err.decode().strip().splitlines()[-1]
    assert out == b""
