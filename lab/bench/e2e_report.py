"""The figures of `make bench-e2e` (lab.bench.e2e) summarised: the floors beside the system,
the burst goals as ratios (issue 29), tracing's and TLS's cost (issue 27 §3), the means over
rounds, and the table a person reads before the JSON line.

Owns: pure computations over the measured runs. Must never: measure anything, or judge a figure
beyond printing it beside its goal.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from lab.bench import floor as bench_floor
from lab.bench import locks as bench_locks
from lab.bench.handoff import anatomy_line
from lab.bench.hot import hot_line
from lab.bench.statements import statements_line


def tracing_cost(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """Tracing on against off, same rounds: burst throughput and CPU per payout (in all and per
    process: what tracing adds where)."""
    cpu_on, cpu_off = on.get("cpu_ms_per_payout", {}), off.get("cpu_ms_per_payout", {})
    total_on, total_off = cpu_on.get("total"), cpu_off.get("total")
    return {
        "throughput_per_s": {"on": on["throughput_per_s"], "off": off["throughput_per_s"]},
        "throughput_ratio": (
            round(on["throughput_per_s"] / off["throughput_per_s"], 3)
            if on["throughput_per_s"] and off["throughput_per_s"]
            else None
        ),
        "cpu_ms_per_payout": {"on": total_on, "off": total_off},
        "cpu_ratio": round(total_on / total_off, 3) if total_on and total_off else None,
        # A process of one side only counts whole: the PostgreSQL TLS front (`postgres-tls`)
        # runs only with TLS on.
        "cpu_added_ms_per_payout": {
            k: round(cpu_on.get(k, 0.0) - cpu_off.get(k, 0.0), 1)
            for k in [*cpu_on, *(k for k in cpu_off if k not in cpu_on)]
        },
    }


def floor_figures(
    floors: dict[str, list[dict[str, Any]]], system_tasks: float | None
) -> dict[str, Any]:
    """`baseline_floor` is the payout's shape before the merge (6 workflow tasks); `floor` the
    floor shape whose workflow tasks, counted from its histories, are nearest the real payouts'
    measured tasks per payout (the 2-task `run` shape of the two-task path, the
    3-task `execute` one for the three-task A/B); `merged_floor` the issue's 4-task trial, and
    `three_task_floor` / `two_task_floor` always, for comparison."""
    means = {shape: bench_floor.mean(runs) for shape, runs in floors.items()}
    tasks = system_tasks if system_tasks is not None else means["today"]["workflow_tasks"]
    same = min(
        bench_floor.SHAPES,
        key=lambda sh: (abs(means[sh]["workflow_tasks"] - tasks), sh != "today"),
    )
    return {
        "baseline_floor": means["today"],
        "floor": means[same],
        "floor_shape": same,
        "merged_floor": means["merged"],
        "three_task_floor": means["execute"],
        "two_task_floor": means["run"],
    }


def ratios(out: dict[str, Any]) -> dict[str, float | None]:
    """The burst goals as ratios (issue 29): system throughput / same-shape floor (goal >= 0.65)
    and / the 6-task shape's floor (goal >= 1.2)."""
    system = out["system"]["throughput_per_s"] or 0.0

    def ratio(name: str) -> float | None:
        floor = out[name]["throughput_per_s"]
        return round(system / floor, 2) if floor else None

    three = out.get("system_three_task", {}).get("throughput_per_s")
    return {
        "system_to_floor": ratio("floor"),
        "system_to_baseline_floor": ratio("baseline_floor"),
        # The two-task lever (issue 29): the same system in its three-task shape, same run.
        "system_to_three_task": round(system / three, 2) if three else None,
    }


def system_mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "throughput_per_s",
        "execution_p50_ms",
        "execution_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "workflow_tasks_per_payout",
    )
    out: dict[str, Any] = {}
    for k in keys:
        vals = [r[k] for r in runs if r[k] is not None]
        out[k] = round(statistics.mean(vals), 2) if vals else None
    out["breakdown_ms"] = {
        k: round(statistics.mean(r["breakdown_ms"][k] for r in runs), 1)
        for k in runs[0]["breakdown_ms"]
    }
    cpus = [r["cpu_ms_per_payout"] for r in runs if "cpu_ms_per_payout" in r]
    if cpus:
        out["cpu_ms_per_payout"] = {
            k: round(statistics.mean(c.get(k, 0.0) for c in cpus), 1) for k in cpus[0]
        }
    calls = [r["temporal_calls_per_payout"] for r in runs if "temporal_calls_per_payout" in r]
    if calls:
        names = sorted({k for c in calls for k in c})
        out["temporal_calls_per_payout"] = {
            k: round(statistics.mean(c.get(k, 0.0) for c in calls), 2) for k in names
        }
    out["terminal"] = sum(r["terminal"] for r in runs)
    out["payouts"] = sum(r["n"] for r in runs)
    states: Counter[str] = Counter()
    for r in runs:
        states.update(r["states"])
    out["states"] = dict(states)
    return out


_breakdown_cols = ("wft_wait_s", "wft_run_s", "activity_wait_s", "activity_run_s", "workflow_s")


def _hot_lines(hot: dict[str, Any]) -> list[str]:
    """The hot account's lines: its pace, its statements and its hand-off's segments."""
    lines = [hot_line(hot)]
    if "statements_per_payout" in hot:
        lines.append(statements_line("hot account", hot))
    if "handoff_anatomy_p50_ms" in hot:
        lines.append(anatomy_line(hot))
    return lines


def table(result: dict[str, Any]) -> str:
    cols = (
        "throughput_per_s",
        "execution_p50_ms",
        "execution_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "tasks",
    )
    lines = [f"{'run':<16}" + "".join(f"{c:>18}" for c in cols)]
    lines.append(f"(floor = the {result['floor_shape']!r} shape; floor p50/p99: start -> result)")
    for name in ("baseline_floor", "floor", "merged_floor", "three_task_floor", "two_task_floor"):
        f = result[name]
        row = (f["throughput_per_s"], f["p50_ms"], f["p99_ms"], "", "", f["workflow_tasks"])
        lines.append(f"{name:<16}" + "".join(f"{v!s:>18}" for v in row))
    for name in ("system", "system_three_task", "degraded"):
        s = result[name]
        row = (*(s[c] for c in cols[:-1]), s["workflow_tasks_per_payout"])
        lines.append(f"{name:<16}" + "".join(f"{v!s:>18}" for v in row))
    cpu3 = result["system_three_task"].get("cpu_ms_per_payout")
    if cpu3:
        lines.append(
            "three-task burst CPU per payout, ms: "
            + " ".join(f"{k}={v}" for k, v in sorted(cpu3.items(), key=lambda kv: -kv[1]))
        )
    st = result["steady"]
    row = (st["rate_per_s"], *(st[c] for c in cols[1:-1]), "")
    lines.append(f"{'steady (rate)':<16}" + "".join(f"{v!s:>18}" for v in row))
    lines.append("per payout, mean ms: " + " ".join(_breakdown_cols))
    for name in ("system", "steady", "degraded"):
        b = result[name]["breakdown_ms"]
        lines.append(f"  {name:<14}" + "".join(f"{b[k]!s:>16}" for k in _breakdown_cols))
    cpu = result["system"].get("cpu_ms_per_payout")
    if cpu:
        lines.append(
            "system burst CPU per payout, ms: "
            + " ".join(f"{k}={v}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
        )
    for name, what in (("system", "system burst"), ("system_three_task", "three-task burst")):
        if "statements_per_payout" in result[name]:
            lines.append(statements_line(what, result[name]))
    calls = result["system"].get("temporal_calls_per_payout")
    if calls:
        lines.append(
            "system burst Temporal calls per payout: "
            + " ".join(f"{k}={v}" for k, v in calls.items() if not k.startswith("persistence."))
        )
    d, t = result["degraded"], result["takeover"]
    lines.append(
        f"degraded: breaker opened {d['breaker_opened']}x, outage {d['outage_s']}s, "
        f"states {d['states']}"
    )
    lines.append(
        f"takeover: {t['seconds']} s at a {t['ttl_s']} s TTL (goal {2 * t['ttl_s'] + 5} s;"
        f" W2 polling after {t.get('w2_ready_s')} s of it)"
    )
    if result.get("hot"):
        lines.extend(_hot_lines(result["hot"]))
    cost = result.get("tracing_cost")
    if cost:
        tp, cpu = cost["throughput_per_s"], cost["cpu_ms_per_payout"]
        lines.append(
            f"TLS and tracing on/off: burst {tp['on']} / {tp['off']} payouts/s (ratio "
            f"{cost['throughput_ratio']}), CPU per payout {cpu['on']} / {cpu['off']} ms (ratio "
            f"{cost['cpu_ratio']}); added ms per payout: "
            + " ".join(f"{k}={v}" for k, v in cost["cpu_added_ms_per_payout"].items())
        )
    r = result["ratios"]
    total = (result["system"].get("cpu_ms_per_payout") or {}).get("total")
    lines.append(  # issue 29's goals
        f"burst: system/floor {r['system_to_floor']} (goal >= 0.65), "
        f"system/baseline_floor {r['system_to_baseline_floor']} (goal >= 1.2), "
        f"CPU per payout {total} ms (goal <= 70)"
    )
    locks = result.get("locks")
    if locks:
        kinds = [kind for kind in ("etcd", "postgres", bench_locks.SYNC) if kind in locks]
        ratios = ", ".join(f"{kind} {locks[kind]['ratio_to_http_floor']}" for kind in kinds)
        lines.append(f"lock acquire+release p50 / HTTP floor: {ratios} (goal <= 1.5)")
        split = ", ".join(
            f"{kind} {locks[kind]['tls_added_p50_ms']} + {locks[kind]['tracing_added_p50_ms']}"
            f" (TLS on, tracing off: {locks[kind]['tls_untraced_ratio_to_http_floor']})"
            for kind in kinds
        )
        lines.append(f"lock p50 over plain and untraced, TLS + tracing ms: {split}")
    lines.append(f"loadavg before {result['loadavg_before']}  after {result['loadavg_after']}")
    return "\n".join(lines)
