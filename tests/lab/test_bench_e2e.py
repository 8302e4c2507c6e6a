"""`make bench-e2e` (`python -m lab.bench.e2e`) run tiny as a real subprocess: its own local
stack (real PostgreSQL, lock service, rail stub and proxy, workers, Temporal dev server), the
floor's own dev server, and the pause experiment's stack. Asserts the last line is the issue's
JSON object, that every payout of every phase reached a terminal state, and that the histories
were read (workflow tasks counted). No timing is asserted (the machine is shared)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from common.tracefile import read_spans
from lab.bench.floor import SHAPES
from lab.bench.handoff import SEGMENTS

TERMINAL = {"POSTED", "FAILED", "ABANDONED"}


def _all_terminal(figures: dict[str, Any], n: int) -> None:
    assert figures["terminal"] == n, figures
    assert sum(figures["states"].values()) == n
    assert set(figures["states"]) <= TERMINAL, figures["states"]


def _assert_only_the_traced_stack_traced(run_dir: Path) -> None:
    """The traced stack's processes (and the bench, the starter) wrote spans; the untraced
    stack's (OTEL_SDK_DISABLED=true) wrote none."""
    stacks = sorted(run_dir.glob("stack-*"), key=lambda d: len(read_spans(d)))
    assert len(stacks) == 2 and read_spans(stacks[0]) == []
    services = {s.service for s in read_spans(stacks[1])}
    assert {"worker", "lock-server", "railproxy", "railstub"} <= services
    assert any(s.service == "bench-e2e" for s in read_spans(run_dir / "traces"))


def _assert_statements_counted(result: dict[str, Any], out: str) -> None:
    """Read from the trace files once the stacks were down: every payout's trace found whole,
    its statements run by the workers, the lock server and the rail proxy at least."""
    for name in ("system", "system_three_task", "hot"):
        figures = result[name]
        assert figures["traced_payouts"] == figures["payouts"] == 3, figures
        assert figures["orphan_spans"] == 0, figures
        per = figures["statements_per_payout"]
        assert min(per["workers"], per["lock-server"], per["railproxy"]) > 0, per
        assert abs(per["total"] - sum(v for k, v in per.items() if k != "total")) < 0.05, per
    assert "system burst PostgreSQL statements per payout: total=" in out
    assert "three-task burst PostgreSQL statements per payout: total=" in out
    assert "hot account PostgreSQL statements per payout: total=" in out
    # The hot account's 3 payouts: 2 hand-offs, each segment read from their traces.
    anatomy = result["hot"]["handoff_anatomy_p50_ms"]
    assert result["hot"]["handoff_anatomy_pairs"] == 2, result["hot"]
    assert all(anatomy[name] is not None for name in anatomy), anatomy
    # Bounded by two spans of one process, or by a request's start and its arrival: never
    # negative. (`rail_to_proxy` and `answer_to_worker` end a server's span against its
    # client's, which may close first: lab.bench.handoff.)
    causal = set(SEGMENTS) - {"rail_to_proxy", "answer_to_worker"}
    assert all(anatomy[name] >= 0 for name in causal), anatomy
    assert "hot account hand-off p50 by segment, ms: rail_to_proxy=" in out


async def test_bench_e2e_tiny_prints_the_issue_json_last(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "lab.bench.e2e", "--n", "3", "--rounds", "1", "--workers", "1"),
        *("--steady-s", "2", "--degraded-n", "3", "--outage-max-s", "3", "--hot-n", "3"),
        *("--locks-n", "5"),
        *("--run-dir", str(tmp_path)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 600)  # two stacks: traced, untraced
    assert proc.returncode == 0, (out.decode()[-2000:], err.decode()[-2000:])
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert (result["n"], result["workers"], result["rail_latency_ms"]) == (3, 1, 300)
    assert result["baseline_floor"]["workflow_tasks"] == 6
    # `floor` is the floor shape nearest the payouts' measured workflow tasks: since the
    # two-task path (issue 29), the 2-task shape.
    assert result["floor_shape"] == "run"
    assert result["floor"]["workflow_tasks"] == SHAPES[result["floor_shape"]][1] == 2
    assert result["merged_floor"]["workflow_tasks"] == 4
    assert result["three_task_floor"]["workflow_tasks"] == 3
    assert result["two_task_floor"]["workflow_tasks"] == 2
    for name in ("baseline_floor", "floor", "merged_floor", "three_task_floor", "two_task_floor"):
        f = result[name]
        assert f["throughput_per_s"] > 0 and 0 < f["p50_ms"] <= f["p99_ms"]
    system = result["system"]
    _all_terminal(system, 3)
    assert system["throughput_per_s"] > 0
    assert 0 < system["execution_p50_ms"] <= system["execution_p99_ms"]
    assert 0 < system["e2e_p50_ms"] <= system["e2e_p99_ms"]
    # Counted from real histories: 2 when no task is retried (the start, the completion), fewer
    # than the 6 of the separate holder steps; the three-task shape of the same run, 3 or more.
    assert 2 <= system["workflow_tasks_per_payout"] < 6
    three = result["system_three_task"]
    _all_terminal(three, 3)
    assert 3 <= three["workflow_tasks_per_payout"] < 6
    assert set(result["ratios"]) == {
        "system_to_floor",
        "system_to_baseline_floor",
        "system_to_three_task",
    }
    # Read from the stack's dev server: each payout started once and completed its workflow
    # tasks (at least the start's and the completion).
    calls = system["temporal_calls_per_payout"]
    assert calls["rpc.StartWorkflowExecution"] == 1.0
    assert calls["rpc.RespondWorkflowTaskCompleted"] >= 2
    nearest = min(SHAPES.values(), key=lambda v: abs(v[1] - system["workflow_tasks_per_payout"]))
    assert result["floor"]["workflow_tasks"] == nearest[1]
    for name in ("system", "steady", "degraded"):  # read from the real histories
        b = result[name]["breakdown_ms"]
        assert b["workflow_s"] > 0 and b["activity_run_s"] > 0 and b["wft_run_s"] > 0
    # Tracing on (the system above) and off, in the same rounds: each side's payouts all ended.
    _all_terminal(result["system_untraced"], 3)
    cost = result["tracing_cost"]
    assert cost["throughput_per_s"]["off"] == result["system_untraced"]["throughput_per_s"]
    assert cost["cpu_ms_per_payout"]["on"] == system["cpu_ms_per_payout"]["total"] > 0
    assert "tracing on/off: burst" in out.decode()  # the table's line
    _assert_only_the_traced_stack_traced(tmp_path)
    steady = result["steady"]
    assert steady["rate_per_s"] > 0 and steady["n"] >= 2
    _all_terminal(steady, steady["n"])
    assert steady["execution_p99_ms"] > 0 and steady["e2e_p99_ms"] > 0
    degraded = result["degraded"]
    _all_terminal(degraded, 3)
    assert degraded["latency_p99_ms_rail"] == 3000.0
    assert isinstance(degraded["breaker_opened"], int)
    hot = result["hot"]  # 3 payouts on one account: one after another at the rail
    assert hot["states"] == {"POSTED": 3} and hot["spread_states"] == {"POSTED": 3}
    assert hot["rail_limit_s"] == 0.9 and hot["drain_s"] > 0 and hot["spread_drain_s"] > 0
    assert abs(hot["pace_ratio"] - hot["rail_limit_s"] / hot["drain_s"]) < 0.01  # rounded
    # Read from the stub's movement log: 2 hand-offs, none before the previous answer came back.
    assert hot["handoff_min_ms"] is not None and hot["handoff_min_ms"] >= 0
    assert "hot account: 3 payouts drained in" in out.decode()
    _assert_statements_counted(result, out.decode())
    locks = result["locks"]  # bench_locks.run, in the same run: every backend beside its floor
    for kind in ("etcd", "postgres", "postgres_sync"):
        assert locks[kind]["p50_ms"] > 0 and locks[kind]["http_floor_p50_ms"] > 0
        assert locks[kind]["ratio_to_http_floor"] > 0
    assert "lock acquire+release p50 / HTTP floor: etcd" in out.decode()
    assert "lock p50 over plain and untraced, TLS + tracing ms: etcd" in out.decode()
    takeover = result["takeover"]
    assert takeover["ttl_s"] == 3.0 and takeover["seconds"] > 0 and takeover["ok"] is True
    assert result["loadavg_before"] and result["loadavg_after"]


async def test_bench_e2e_refuses_bad_sizes_in_one_line() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "lab.bench.e2e", "--n", "0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "must be at least 1" in err.decode().strip().splitlines()[-1]
    assert out == b""
