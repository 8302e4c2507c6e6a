"""The real system's side of `make bench-e2e` (lab.bench.e2e): bursts of N payouts, a steady
rate, and a burst on a degraded rail (a 3 s latency tail and an outage that opens the proxy's
breaker), each measured from the payment database (created, terminal), the Temporal histories
(workflow start, workflow tasks, where the time went), /proc (CPU per payout) and the dev
server's counters (Temporal calls per payout).

Owns: the run's options (`Options`), one measured stack (`System`) and its figures. Must never:
assert a timing, or make the rail decline or answer ambiguously (the outage records nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from lab.bench import temporal_rpcs
from lab.bench.cpu import per_item_ms, snapshot
from lab.bench.stats import nearest_rank
from lab.experiments.evidence import json_events
from ledger.states import TERMINAL_STATES
from payouts.commands import PayoutSpec, create_payouts, seed_accounts, start_workflows
from payouts.follow import settle_payouts
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
    #: Payouts on one account for the hot-account section (lab.bench.hot; 0 skips it).
    hot_n: int = 40
    #: Acquire+release pairs per lock measurement (lab.bench.locks, after the stacks; 0 skips).
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
        # For the statements per payout, counted from the trace files once the stack is down.
        "payout_ids": ids,
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


async def rail_behaviour(stack: Stack, patch: dict[str, Any]) -> None:
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
    await rail_behaviour(
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
    await rail_behaviour(stack, {"outage": False})
    progress(f"degraded: rail outage lifted after {outage_s}s; 3 s latency tail stays")
    states = await _wait_terminal(sysm, ids, "degraded", progress)
    figures = await _figures(sysm, ids)
    transitions = [e.get("to_state") for e in _circuit_events(stack)[before:]]
    await rail_behaviour(stack, {"latency_mode": "fixed", "latency_fixed_ms": opts.rail_latency_ms})
    return {
        **figures,
        "latency_p99_ms_rail": max(p50, DEGRADED_P99_MS),
        "outage_s": outage_s,
        "breaker_opened": transitions.count("OPEN"),
        "breaker_transitions": transitions,
        "states": dict(states),
    }
