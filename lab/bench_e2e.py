"""End-to-end benchmark (`python -m lab.bench_e2e`, `make bench-e2e`): the real payout system
beside Temporal's own floor for the same shape, on one machine state (issue 16).

Owns: one local stack (`stack.system.Stack`: PostgreSQL, lock service, rail stub at a fixed
latency, rail proxy, W workers, the stack's own Temporal dev server) and one floor dev server
(`lab.bench_floor.floor_server`, same transfer-queue read rate and worker count), measured
alternately round by round: floor bursts of each shape (`bench_floor.SHAPES`), then a burst of
N real payouts (one per account); then a steady rate at 70% of the measured burst throughput, a
degraded-rail burst (a 3 s latency tail and an outage that opens the proxy's breaker), the hot
account (N payouts on one account against the rail's pace: lab.bench_hot), the UC-03 pause
experiment's takeover figure and, once the stacks are down, `make bench-locks`' measurement
(lab.bench_locks.run: lock acquire+release against its HTTP floor, both backends). Latencies
come from the payment database (created, terminal) and the Temporal histories (workflow start,
workflow tasks).

Tracing's and TLS's cost (issue 27 §3): the stack above traces and serves TLS, as every stack
does by default (this process starts the payouts, the roots of their traces); a second,
identical stack runs with OTEL_SDK_DISABLED=true and plain HTTP, and its bursts alternate with
the traced ones in the same rounds (`system_untraced`, `tracing_cost`). `--no-untraced` skips
it.

Must never: assert a timing (it reports figures), make the rail decline or answer ambiguously
(except the outage, which records nothing), or leave a process behind. Prints progress, a
table, and as its LAST line one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from common import tracing
from lab import bench_floor, bench_locks, temporal_rpcs
from lab.bench_hot import HotTarget, hot_account, hot_line
from lab.bench_locks import loadavg
from lab.cpu import per_item_ms, snapshot
from lab.experiments import LOCK_TTL_S, isolated_ports, json_events, pause_experiment
from lab.stats import nearest_rank
from ledger.states import TERMINAL_STATES
from payouts.commands import (
    PayoutSpec,
    connect_temporal,
    create_payouts,
    seed_accounts,
    start_workflows,
)
from payouts.follow import settle_payouts
from stack.config import StackConfig
from stack.pki import trust_stack_ca_in_this_process
from stack.system import Stack

#: The degraded rail's latency tail (STD01-13, issue 16: "3 s tail"): lognormal p99.
DEGRADED_P99_MS = 3000.0

Progress = Callable[[str], None]


@dataclass
class Options:
    n: int = 40
    workers: int = 4
    rounds: int = 2
    rail_latency_ms: int = 300
    steady_s: float = 20.0
    degraded_n: int = 40
    #: Payouts on one account for the hot-account section (lab.bench_hot; 0 skips it).
    hot_n: int = 40
    #: Acquire+release pairs per lock measurement (lab.bench_locks, after the stacks; 0 skips).
    locks_n: int = 500
    #: The longest the degraded run keeps the rail in outage waiting for the breaker to open.
    outage_max_s: float = 10.0
    takeover: bool = True
    backend: str = "postgres"
    #: A second stack with tracing off, its bursts alternated with the traced stack's.
    untraced: bool = True
    settle_timeout_s: float = 600.0
    run_dir: Path = field(default_factory=lambda: Path(".run") / "bench-e2e")


@dataclass
class System:
    stack: Stack
    client: Any
    pool: asyncpg.Pool
    options: Options


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


# --------------------------------------------------------------------------- the real system


async def _accounts(sysm: System, n: int) -> list[str]:
    prefix = f"b{uuid.uuid4().hex[:6]}-"
    return await seed_accounts(sysm.stack.database_url, n, 1_000_000, prefix)


def _specs(accounts: list[str], run: str) -> list[PayoutSpec]:
    return [PayoutSpec(f"po-{run}-{i:06d}", a, 1_000 + i) for i, a in enumerate(accounts)]


async def _wait_terminal(
    sysm: System, ids: list[str], what: str, progress: Progress
) -> Counter[str]:
    """Poll the payment database until every payout is terminal (or the settle timeout)."""
    return await settle_payouts(
        sysm.pool,
        ids,
        timeout_s=sysm.options.settle_timeout_s,
        progress=progress,
        interval_s=0.5,
        label=f"{what}: ",
    )


def history_breakdown(events: list[Any]) -> dict[str, float]:
    """Where one workflow's time went (seconds), from its history events: workflow tasks
    waiting to be picked up / being processed, activities waiting / running, and the whole
    workflow (first to last event). The waits are what a saturated engine adds."""
    from temporalio.api.enums.v1 import EventType as T

    at = {e.event_id: e.event_time.ToDatetime() for e in events}
    out = dict.fromkeys(("wft_wait_s", "wft_run_s", "activity_wait_s", "activity_run_s"), 0.0)
    pairs = {
        T.EVENT_TYPE_WORKFLOW_TASK_STARTED: ("wft_wait_s", "workflow_task_started"),
        T.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: ("wft_run_s", "workflow_task_completed"),
        T.EVENT_TYPE_ACTIVITY_TASK_STARTED: ("activity_wait_s", "activity_task_started"),
        T.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("activity_run_s", "activity_task_completed"),
        T.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("activity_run_s", "activity_task_failed"),
    }
    for e in events:
        if e.event_type not in pairs:
            continue
        key, attr = pairs[e.event_type]
        attrs = getattr(e, f"{attr}_event_attributes")
        before = attrs.scheduled_event_id if key.endswith("wait_s") else attrs.started_event_id
        if before in at:
            out[key] += (at[e.event_id] - at[before]).total_seconds()
    out["workflow_s"] = (at[events[-1].event_id] - at[events[0].event_id]).total_seconds()
    return out


async def _history(
    sysm: System, payout_id: str, sem: asyncio.Semaphore
) -> tuple[datetime, int, dict[str, float]]:
    """The workflow's start time, its completed workflow tasks and where its time went, from
    its Temporal history (waiting for the workflow to close: release comes after the terminal
    state)."""
    from temporalio.api.enums.v1 import EventType

    async with sem:
        handle = sysm.client.get_workflow_handle(f"payout-{payout_id}")
        with contextlib.suppress(Exception):  # a failed workflow still has its history
            await asyncio.wait_for(handle.result(), sysm.options.settle_timeout_s)
        history = await handle.fetch_history()
    events = list(history.events)
    started = events[0].event_time.ToDatetime().replace(tzinfo=None)
    tasks = sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    return started, tasks, history_breakdown(events)


async def _figures(sysm: System, ids: list[str]) -> dict[str, Any]:
    """Throughput, execution and end-to-end latencies, workflow tasks per payout."""
    rows = await sysm.pool.fetch(
        "SELECT p.payout_id, p.created_at AT TIME ZONE 'UTC' AS created,"
        " (SELECT min(a.at) FROM paydb.audit_log a WHERE a.payout_id = p.payout_id"
        "   AND a.to_state = ANY($2::text[])) AT TIME ZONE 'UTC' AS terminal"
        " FROM paydb.payouts p WHERE p.payout_id = ANY($1::text[])",
        ids,
        [str(s) for s in TERMINAL_STATES],
    )
    sem = asyncio.Semaphore(16)
    hist = dict(zip(ids, await asyncio.gather(*(_history(sysm, i, sem) for i in ids)), strict=True))
    done = [r for r in rows if r["terminal"] is not None]
    execution = [(r["terminal"] - hist[r["payout_id"]][0]).total_seconds() for r in done]
    e2e = [(r["terminal"] - r["created"]).total_seconds() for r in done]
    out: dict[str, Any] = {"n": len(ids), "terminal": len(done)}
    if done:
        first = min(h[0] for h in hist.values())
        last = max(r["terminal"] for r in done)
        out["throughput_per_s"] = round(len(done) / max(1e-3, (last - first).total_seconds()), 2)
    else:
        out["throughput_per_s"] = 0.0
    out |= {
        "execution_p50_ms": _ms(nearest_rank(execution, 50)),
        "execution_p99_ms": _ms(nearest_rank(execution, 99)),
        "e2e_p50_ms": _ms(nearest_rank(e2e, 50)),
        "e2e_p99_ms": _ms(nearest_rank(e2e, 99)),
        "workflow_tasks_per_payout": round(statistics.mean(h[1] for h in hist.values()), 2),
        "breakdown_ms": {
            k: round(statistics.mean(h[2][k] for h in hist.values()) * 1000, 1)
            for k in next(iter(hist.values()))[2]
        },
    }
    return out


async def system_burst(
    sysm: System, n: int, progress: Progress, what: str, **overrides: Any
) -> dict[str, Any]:
    """N payouts, one per account, created then started at once (`overrides`: PayoutInput
    fields, e.g. two_task=False for the three-task shape of the A/B)."""
    specs = _specs(await _accounts(sysm, n), uuid.uuid4().hex[:6])
    ids = [s.payout_id for s in specs]
    await create_payouts(sysm.stack.database_url, specs)
    metrics_port = sysm.stack.config.ports.temporal_metrics
    calls_before = await temporal_rpcs.settled(metrics_port)
    before = _cpu(sysm)
    await start_workflows(
        sysm.stack.temporal_address,
        sysm.stack.config.task_queue,
        specs,
        client=sysm.client,
        **overrides,
    )
    states = await _wait_terminal(sysm, ids, what, progress)
    cpu = per_item_ms(before, _cpu(sysm), n)
    figures = await _figures(sysm, ids)  # waits for every workflow to close
    # Counted after the close, so they include the bench's own history reads (rpc.Get... and
    # rpc.PollWorkflowExecutionHistory); the CPU above stops at the last terminal state.
    calls = temporal_rpcs.per_item(calls_before, await temporal_rpcs.settled(metrics_port), n)
    return figures | {
        "states": dict(states),
        "cpu_ms_per_payout": cpu,
        "temporal_calls_per_payout": calls,
    }


def _cpu(sysm: System) -> dict[str, float]:
    """CPU seconds so far of each stack process (workers summed), and of this process (it only
    starts the workflows and polls: its share is the benchmark's own)."""
    pids = {name: info.pid for name, info in sysm.stack.processes.items() if info.pid}
    cpu = snapshot(pids)
    out: dict[str, float] = {"bench": time.process_time()}
    for name, seconds in cpu.items():
        key = "workers" if name.startswith("worker-") else name
        out[key] = out.get(key, 0.0) + seconds
    return out


async def system_steady(sysm: System, rate: float, progress: Progress) -> dict[str, Any]:
    """Payouts created and started one by one at `rate` per second for `steady_s`."""
    from ledger import PayoutStore, WorkContext

    count = max(2, round(rate * sysm.options.steady_s))
    specs = _specs(await _accounts(sysm, count), uuid.uuid4().hex[:6])
    store = PayoutStore(sysm.pool)
    progress(f"steady: {count} payouts at {rate:.2f}/s")

    async def one(s: PayoutSpec) -> None:
        ctx = WorkContext(correlation_id=s.payout_id, actor="bench-e2e")
        await store.create_payout(s.payout_id, s.account_id, s.amount, ctx)
        await start_workflows(
            sysm.stack.temporal_address, sysm.stack.config.task_queue, [s], client=sysm.client
        )

    t0 = time.monotonic()
    tasks = []
    for i, s in enumerate(specs):
        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one(s)))
    await asyncio.gather(*tasks)
    ids = [s.payout_id for s in specs]
    states = await _wait_terminal(sysm, ids, "steady", progress)
    figures = await _figures(sysm, ids)
    keep: tuple[str, ...] = ("n", "terminal", "execution_p50_ms", "execution_p99_ms")
    keep = (*keep, "e2e_p50_ms", "e2e_p99_ms", "breakdown_ms")
    return {"rate_per_s": round(rate, 2), **{k: figures[k] for k in keep}, "states": dict(states)}


# --------------------------------------------------------------------------- degraded rail


async def _rail_behaviour(stack: Stack, patch: dict[str, Any]) -> None:
    async with httpx.AsyncClient(
        base_url=stack.railstub_url, timeout=10, headers=stack.operator_headers()
    ) as http:
        r = await http.post("/admin/behaviour", json=patch)
        r.raise_for_status()


def _circuit_events(stack: Stack) -> list[dict[str, Any]]:
    path = stack.processes["railproxy"].log_path
    return [e for e in json_events(path) if e.get("event") == "rail.circuit"]


async def system_degraded(sysm: System, progress: Progress) -> dict[str, Any]:
    """A burst while the rail answers 503 (nothing recorded) until the proxy's breaker opens,
    then with a lognormal latency tail (p50 = the fixed latency, p99 3 s)."""
    stack, opts = sysm.stack, sysm.options
    before = len(_circuit_events(stack))
    p50 = float(max(1, opts.rail_latency_ms))
    await _rail_behaviour(
        stack,
        {
            "latency_mode": "lognormal",
            "latency_p50_ms": p50,
            "latency_p99_ms": max(p50, DEGRADED_P99_MS),
            "outage": True,
        },
    )
    specs = _specs(await _accounts(sysm, opts.degraded_n), uuid.uuid4().hex[:6])
    ids = [s.payout_id for s in specs]
    await create_payouts(stack.database_url, specs)
    await start_workflows(
        stack.temporal_address, stack.config.task_queue, specs, client=sysm.client
    )
    deadline = time.monotonic() + opts.outage_max_s
    while time.monotonic() < deadline:
        if any(e.get("to_state") == "OPEN" for e in _circuit_events(stack)[before:]):
            break
        await asyncio.sleep(0.2)
    outage_s = round(opts.outage_max_s - max(0.0, deadline - time.monotonic()), 1)
    await _rail_behaviour(stack, {"outage": False})
    progress(f"degraded: rail outage lifted after {outage_s}s; 3 s latency tail stays")
    states = await _wait_terminal(sysm, ids, "degraded", progress)
    figures = await _figures(sysm, ids)
    transitions = [e.get("to_state") for e in _circuit_events(stack)[before:]]
    await _rail_behaviour(
        stack, {"latency_mode": "fixed", "latency_fixed_ms": opts.rail_latency_ms}
    )
    return {
        **figures,
        "latency_p99_ms_rail": max(p50, DEGRADED_P99_MS),
        "outage_s": outage_s,
        "breaker_opened": transitions.count("OPEN"),
        "breaker_transitions": transitions,
        "states": dict(states),
    }


# --------------------------------------------------------------------------- the run


def _stack_config(opts: Options) -> StackConfig:
    rail_env = {
        "RAILSTUB_LATENCY_MODE": "fixed",
        "RAILSTUB_LATENCY_FIXED_MS": str(opts.rail_latency_ms),
        "RAILSTUB_AMBIGUITY_RATE": "0",
        "RAILSTUB_DECLINE_RATE": "0",
        "RAILSTUB_DELAYED_RATE": "0",
    }
    return StackConfig.from_env(
        run_dir=opts.run_dir / f"stack-{uuid.uuid4().hex[:6]}",
        workers=opts.workers,
        backend=opts.backend,
        ports=isolated_ports(),
        service_env={"railstub": rail_env},
    )


async def _rounds(
    sysm: System, floor: tuple[Any, str], progress: Progress, untraced: System | None = None
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Floor bursts of every shape, a system burst, the system in its three-task shape (the
    two-task lever's A/B, issue 29), and one of the untraced system (tracing's A/B, issue 27),
    alternated round by round. Returns the floors' runs and the systems' runs by name."""
    opts = sysm.options
    floors: dict[str, list[dict[str, Any]]] = {shape: [] for shape in bench_floor.SHAPES}
    runs: dict[str, list[dict[str, Any]]] = {"system": [], "system_three_task": []}
    if untraced is not None:
        runs["system_untraced"] = []
    client, shared = floor
    await bench_floor.burst(client, shared, "today", min(opts.n, 20))  # warm-up
    for r in range(opts.rounds):
        steps = [*bench_floor.SHAPES, *runs]
        for step in steps if r % 2 == 0 else list(reversed(steps)):
            if step in runs:
                target = untraced if step == "system_untraced" and untraced else sysm
                if not runs[step]:
                    await target.stack.wait_for_rail_history()
                shape = {"two_task": False} if step == "system_three_task" else {}
                res = await system_burst(target, opts.n, progress, f"round {r + 1} {step}", **shape)
                runs[step].append(res)
            else:
                res = await bench_floor.burst(client, shared, step, opts.n)
                floors[step].append(res)
            progress(f"round {r + 1} {step}: {res}")
    return floors, runs


@contextlib.asynccontextmanager
async def _system(
    config: StackConfig, opts: Options, progress: Progress, *, traced: bool
) -> AsyncIterator[System]:
    """A started stack, its rail at the fixed latency, a pool and a Temporal client (traced, so
    that each start is its trace's root, only for the traced stack)."""
    from temporalio.client import Client

    async with Stack(config, progress=progress) as stack:
        await _rail_behaviour(
            stack, {"latency_mode": "fixed", "latency_fixed_ms": opts.rail_latency_ms}
        )
        pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=8)
        try:
            if traced:
                client = await connect_temporal(stack.temporal_address)
            else:
                client = await Client.connect(stack.temporal_address)
            yield System(stack, client, pool, opts)
        finally:
            await pool.close()


def _untraced_config(opts: Options) -> StackConfig:
    """The same stack with OTEL_SDK_DISABLED=true for every process (common.tracing) and plain
    HTTP (`tls=False`): the off side of issue 27 §3's "TLS and tracing on (the defaults) and
    off"."""
    config = _stack_config(opts)
    env = {name: dict(values) for name, values in config.service_env.items()}
    env["*"] = {**env.get("*", {}), "OTEL_SDK_DISABLED": "true"}
    return replace(config, service_env=env, tls=False)


async def _measure(opts: Options, work: Path, progress: Progress) -> dict[str, Any]:
    config = _stack_config(opts)
    out: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as systems_up:
        sysm = await systems_up.enter_async_context(_system(config, opts, progress, traced=True))
        untraced = None
        if opts.untraced:
            untraced = await systems_up.enter_async_context(
                _system(_untraced_config(opts), opts, progress, traced=False)
            )
        async with bench_floor.floor_server(
            opts.workers, config.temporal_transfer_rps, work=work
        ) as floor:
            floors, runs = await _rounds(sysm, floor, progress, untraced)
        system = _system_mean(runs["system"])
        out |= _floors(floors, system["workflow_tasks_per_payout"])
        out["system"] = system
        out["system_three_task"] = _system_mean(runs["system_three_task"])
        if runs.get("system_untraced"):
            out["system_untraced"] = _system_mean(runs["system_untraced"])
            out["tracing_cost"] = tracing_cost(system, out["system_untraced"])
        out["ratios"] = _ratios(out)
        rate = 0.7 * out["system"]["throughput_per_s"]
        out["steady"] = await system_steady(sysm, max(rate, 0.1), progress)
        progress(f"steady: {out['steady']}")
        out["degraded"] = await system_degraded(sysm, progress)
        progress(f"degraded: {out['degraded']}")
        if opts.hot_n:
            target = HotTarget(sysm.stack, sysm.client, sysm.pool, opts.settle_timeout_s)
            out["hot"] = await hot_account(target, opts.hot_n, opts.rail_latency_ms, progress)
            progress(f"hot: {out['hot']}")
    return out


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


def _floors(floors: dict[str, list[dict[str, Any]]], system_tasks: float | None) -> dict[str, Any]:
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


def _ratios(out: dict[str, Any]) -> dict[str, float | None]:
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


def _system_mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
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


async def _takeover(opts: Options, progress: Progress) -> dict[str, Any]:
    if not opts.takeover:
        return {"ttl_s": LOCK_TTL_S, "seconds": None, "ok": None, "w2_ready_s": None}
    progress("takeover: the UC-03 pause experiment (its own stack, fencing on)")
    config = replace(
        _stack_config(opts),
        run_dir=opts.run_dir / f"pause-{uuid.uuid4().hex[:6]}",
        workers=0,
        service_env={},
    )
    result = await pause_experiment(
        config, fencing=True, evidence_dir=config.run_dir / "evidence", progress=progress
    )
    return {
        "ttl_s": LOCK_TTL_S,
        "seconds": result["takeover_s"],
        "ok": result["ok"],
        # freeze -> W2 polling: part of `seconds`, and on a loaded machine most of it
        "w2_ready_s": result["w2_ready_s"],
    }


async def run(opts: Options, progress: Progress) -> dict[str, Any]:
    out: dict[str, Any] = {"n": opts.n, "workers": opts.workers, "rounds": opts.rounds}
    out["rail_latency_ms"] = opts.rail_latency_ms
    out["loadavg_before"] = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as d:
        out |= await _measure(opts, Path(d), progress)
    out["takeover"] = await _takeover(opts, progress)
    if opts.locks_n:
        # Issue 29's lock goal in the same run: `make bench-locks` (its own servers, TLS and
        # tracing on beside off, both backends and the synchronous standby), run once the
        # stacks are down so that it sees the same machine but not their load.
        progress(f"locks: acquire+release against the HTTP floor, n={opts.locks_n}")
        out["locks"] = await bench_locks.run(opts.locks_n)
    out["loadavg_after"] = loadavg()
    return out


_breakdown_cols = ("wft_wait_s", "wft_run_s", "activity_wait_s", "activity_run_s", "workflow_s")


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
        lines.append(hot_line(result["hot"]))
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
        ratios = ", ".join(
            f"{kind} {locks[kind]['ratio_to_http_floor']}"
            for kind in ("etcd", "postgres", bench_locks.SYNC)
            if kind in locks
        )
        lines.append(f"lock acquire+release p50 / HTTP floor: {ratios} (goal <= 1.5)")
    lines.append(f"loadavg before {result['loadavg_before']}  after {result['loadavg_after']}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    d = Options()
    p = argparse.ArgumentParser(prog="python -m lab.bench_e2e", description=__doc__)
    p.add_argument("--n", type=int, default=d.n, help="payouts (and floor workflows) per burst")
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--rounds", type=int, default=d.rounds, help="alternated rounds")
    p.add_argument("--rail-latency-ms", type=int, default=d.rail_latency_ms)
    p.add_argument("--steady-s", type=float, default=d.steady_s, help="steady-rate duration")
    p.add_argument("--degraded-n", type=int, default=d.degraded_n)
    p.add_argument("--outage-max-s", type=float, default=d.outage_max_s)
    p.add_argument(
        "--hot-n", type=int, default=d.hot_n, help="payouts on one account (0: no hot section)"
    )
    p.add_argument(
        "--locks-n", type=int, default=d.locks_n, help="lock pairs per measurement (0: none)"
    )
    p.add_argument("--backend", choices=("postgres", "etcd"), default=d.backend)
    p.add_argument("--no-takeover", action="store_true", help="skip the pause experiment")
    p.add_argument(
        "--no-untraced",
        action="store_true",
        help="skip the second stack with tracing off (OTEL_SDK_DISABLED=true)",
    )
    p.add_argument("--settle-timeout-s", type=float, default=d.settle_timeout_s)
    p.add_argument("--run-dir", type=Path, default=d.run_dir)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    a = parser.parse_args(argv)
    if min(a.n, a.workers, a.rounds, a.degraded_n) < 1:
        parser.error("--n, --workers, --rounds and --degraded-n must be at least 1")
    if min(a.hot_n, a.locks_n) < 0:
        parser.error("--hot-n and --locks-n must be at least 0")
    if a.rail_latency_ms < 0 or a.rail_latency_ms > 600_000:
        parser.error("--rail-latency-ms must be within 0..600000")
    if min(a.steady_s, a.outage_max_s, a.settle_timeout_s) <= 0:
        parser.error("--steady-s, --outage-max-s and --settle-timeout-s must be positive")
    opts = Options(
        n=a.n,
        workers=a.workers,
        rounds=a.rounds,
        rail_latency_ms=a.rail_latency_ms,
        steady_s=a.steady_s,
        degraded_n=a.degraded_n,
        hot_n=a.hot_n,
        locks_n=a.locks_n,
        outage_max_s=a.outage_max_s,
        takeover=not a.no_takeover,
        untraced=not a.no_untraced,
        backend=a.backend,
        settle_timeout_s=a.settle_timeout_s,
        run_dir=a.run_dir,
    )
    # This process starts the traced stack's payouts: the root of each trace, beside its spans.
    tracing.setup("bench-e2e", trace_dir=opts.run_dir / "traces")
    trust_stack_ca_in_this_process()  # its stacks serve https (issue 27): trust their CA
    result = asyncio.run(run(opts, lambda s: print(s, flush=True)))
    tracing.shutdown()
    print(table(result), flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
