"""End-to-end benchmark (`python -m lab.bench.e2e`, `make bench-e2e`): the real payout system
beside Temporal's own floor for the same shape, on one machine state (issue 16).

Owns: one local stack (`stack.system.Stack`: PostgreSQL, lock service, rail stub at a fixed
latency, rail proxy, W workers, the stack's own Temporal dev server) and one floor dev server
(`lab.bench.floor.floor_server`, same transfer-queue read rate and worker count), measured
alternately round by round: floor bursts of each shape (`bench_floor.SHAPES`), then a burst of
N real payouts (one per account); then a steady rate at 70% of the measured burst throughput, a
degraded-rail burst (a 3 s latency tail and an outage that opens the proxy's breaker), the hot
account (N payouts on one account against the rail's pace: lab.bench.hot), the UC-03 pause
experiment's takeover figure and, once the stacks are down, `make bench-locks`' measurement
(lab.bench.locks.run: lock acquire+release against its HTTP floor, both backends). Latencies
come from the payment database (created, terminal) and the Temporal histories (workflow start,
workflow tasks).

Tracing's and TLS's cost (issue 27 §3): the stack above traces and serves TLS, as every stack
does by default (this process starts the payouts, the roots of their traces); a second,
identical stack runs with OTEL_SDK_DISABLED=true and plain HTTP, and its bursts alternate with
the traced ones in the same rounds (`system_untraced`, `tracing_cost`). `--no-untraced` skips
it.

PostgreSQL statements per payout (issue 29), per service and in all, for the traced bursts of
both shapes and the hot account: counted (lab.bench.statements) from the trace files once the
stacks are down, every process having flushed its spans as it stopped. From the same files, where
the hot account's hand-off goes: the median of each segment between one payout's answer at the
rail and the next one's instruction there (lab.bench.handoff, `hot.handoff_anatomy_p50_ms`).

The real system's bursts, steady rate and degraded rail are measured in lab.bench.e2e_system,
the figures summarised and tabled in lab.bench.e2e_report; this module runs the rounds and the
command.

Must never: assert a timing (it reports figures), make the rail decline or answer ambiguously
(except the outage, which records nothing), or leave a process behind. Prints progress, a
table, and as its LAST line one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg

from common import eventloop, tracing
from common.tracefile import read_spans
from lab.bench import floor as bench_floor
from lab.bench import locks as bench_locks
from lab.bench.e2e_report import floor_figures, ratios, system_mean, table, tracing_cost
from lab.bench.e2e_system import (
    Options,
    Progress,
    System,
    rail_behaviour,
    system_burst,
    system_degraded,
    system_steady,
)
from lab.bench.handoff import handoff_anatomy
from lab.bench.hot import HotTarget, hot_account
from lab.bench.locks import loadavg
from lab.bench.statements import statements_per_payout
from lab.experiments.harness import LOCK_TTL_S, isolated_ports
from lab.experiments.pause import pause_experiment
from lab.stoppable import interrupted, run_stoppable
from payouts.commands import connect_temporal
from stack.config import StackConfig
from stack.pki import trust_stack_ca_in_this_process
from stack.system import Stack


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
            shown = {k: v for k, v in res.items() if k != "payout_ids"}
            progress(f"round {r + 1} {step}: {shown}")
    return floors, runs


@contextlib.asynccontextmanager
async def _system(
    config: StackConfig, opts: Options, progress: Progress, *, traced: bool
) -> AsyncIterator[System]:
    """A started stack, its rail at the fixed latency, a pool and a Temporal client (traced, so
    that each start is its trace's root, only for the traced stack)."""
    from temporalio.client import Client

    async with Stack(config, progress=progress) as stack:
        await rail_behaviour(
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
        system = system_mean(runs["system"])
        out |= floor_figures(floors, system["workflow_tasks_per_payout"])
        out["system"] = system
        out["system_three_task"] = system_mean(runs["system_three_task"])
        if runs.get("system_untraced"):
            out["system_untraced"] = system_mean(runs["system_untraced"])
            out["tracing_cost"] = tracing_cost(system, out["system_untraced"])
        out["ratios"] = ratios(out)
        rate = 0.7 * out["system"]["throughput_per_s"]
        out["steady"] = await system_steady(sysm, max(rate, 0.1), progress)
        progress(f"steady: {out['steady']}")
        out["degraded"] = await system_degraded(sysm, progress)
        progress(f"degraded: {out['degraded']}")
        hot_ids: list[str] = []
        if opts.hot_n:
            target = HotTarget(sysm.stack, sysm.client, sysm.pool, opts.settle_timeout_s)
            out["hot"] = await hot_account(target, opts.hot_n, opts.rail_latency_ms, progress)
            hot_ids = out["hot"].pop("payout_ids")
            progress(f"hot: {out['hot']}")
    # The stacks are down: each process flushed its spans as it stopped. This process's own (the
    # payouts' roots) are flushed now; then every span of the bursts is in the files.
    tracing.flush()
    spans = [*read_spans(bench_trace_dir(opts)), *read_spans(config.run_dir / "traces")]
    for name in ("system", "system_three_task"):
        out[name] |= statements_per_payout(spans, [i for r in runs[name] for i in r["payout_ids"]])
    if hot_ids:
        out["hot"] |= statements_per_payout(spans, hot_ids)
        out["hot"] |= handoff_anatomy(spans, hot_ids)
    return out


def bench_trace_dir(opts: Options) -> Path:
    """Where this process writes its spans (the roots of the traced stack's payouts)."""
    return opts.run_dir / "traces"


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


def _parser() -> argparse.ArgumentParser:
    d = Options()
    p = argparse.ArgumentParser(prog="python -m lab.bench.e2e", description=__doc__)
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
    tracing.setup("bench-e2e", trace_dir=bench_trace_dir(opts))
    trust_stack_ca_in_this_process()  # its stacks serve https (issue 27): trust their CA
    # The workers' loop (common.eventloop), for the payouts it starts and bench-locks' client.
    try:
        result = run_stoppable(run(opts, lambda s: print(s, flush=True)), eventloop.run)
    except KeyboardInterrupt:
        return interrupted()
    finally:
        tracing.shutdown()
    print(table(result), flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
