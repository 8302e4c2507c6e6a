"""Engine-floor benchmark (`python -m lab.bench.floor`, `make bench-floor`): what Temporal
alone costs for a workflow of the payout's shape, and the dev server's transfer-queue read rate
as a lever, measured rather than assumed (issue 16, the floor part of `bench-e2e`).

Owns: one fresh Temporal dev server per configuration (the stack's SQLite file and pragmas),
W in-process workers (each with its own worker queue, like the payout workers; the production
worker never registers these workflows), and bursts of no-op workflows of the payout's shape
before the merge (lab.bench.floor_workflows.FloorToday: 5 activities, 6 workflow tasks:
`baseline_floor`), of its shape since (FloorExecute: 2 activities, 3 workflow tasks: `floor`)
and of the issue's 4-task trial (FloorMerged: `merged_floor`), alternated round by round so all
see the same machine load. Workflow tasks are counted from a history of each
burst, not assumed. Must never: assert a timing (it reports), or leave a
process behind. Prints progress, a table, and as its LAST line one JSON object.
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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from lab.bench.floor_workflows import FloorExecute, FloorMerged, FloorRun, FloorToday
from lab.bench.locks import loadavg
from lab.stoppable import interrupted, run_stoppable
from stack.embedded.temporal import temporal_binary
from stack.services import TEMPORAL_SQLITE_PRAGMAS

#: Shape name -> (workflow, the workflow tasks it is built to take; `burst` counts them).
SHAPES: dict[str, tuple[Any, int]] = {
    "today": (FloorToday, 6),
    "merged": (FloorMerged, 4),
    "execute": (FloorExecute, 3),
    "run": (FloorRun, 2),
}
#: The JSON's name for each shape's figures.
JSON_NAMES = {
    "today": "baseline_floor",
    "execute": "floor",
    "merged": "merged_floor",
    "run": "two_task_floor",
}
#: The dev server's default for history.transferProcessorMaxPollRPS.
DEFAULT_TRANSFER_RPS = 20


def _holder_activities() -> list[Any]:
    @activity.defn(name="floor_claim")
    async def claim() -> None:
        return None

    @activity.defn(name="floor_submit")
    async def submit() -> None:
        return None

    @activity.defn(name="floor_post")
    async def post() -> None:
        return None

    @activity.defn(name="floor_release")
    async def release() -> None:
        return None

    @activity.defn(name="floor_execute")
    async def execute() -> None:
        return None

    @activity.defn(name="floor_execute_release")
    async def execute_release() -> None:
        return None

    return [claim, submit, post, release, execute, execute_release]


@contextlib.asynccontextmanager
async def _workers(client: Client, shared: str, count: int) -> AsyncIterator[None]:
    """`count` workers: each polls the shared queue (workflows, the acquire) and its own. Each
    has its own connection, as separate worker processes would (one client cannot register two
    workers on one queue); they share this process's event loop, which worker processes do not."""
    target = client.service_client.config.target_host
    async with contextlib.AsyncExitStack() as stack:
        for i in range(count):
            conn = await Client.connect(target)
            own = f"{shared}-w{i}"

            @activity.defn(name="floor_acquire")
            async def acquire(own: str = own) -> str:
                return own

            @activity.defn(name="floor_acquire_execute")
            async def acquire_execute() -> None:
                return None

            shared_worker = Worker(
                conn,
                task_queue=shared,
                workflows=[w for w, _ in SHAPES.values()],
                activities=[acquire, acquire_execute],
            )
            own_worker = Worker(conn, task_queue=own, activities=_holder_activities())
            await stack.enter_async_context(shared_worker)
            await stack.enter_async_context(own_worker)
        yield


async def burst(client: Client, shared: str, shape: str, n: int) -> dict[str, float]:
    wf, _ = SHAPES[shape]
    started = time.perf_counter()
    latencies: list[float] = []
    handles: list[Any] = []

    async def one() -> None:
        t0 = time.perf_counter()
        handle = await client.start_workflow(
            wf.run, shared, id=f"floor-{shape}-{uuid.uuid4().hex}", task_queue=shared
        )
        handles.append(handle)
        await handle.result()
        latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "throughput_per_s": round(n / elapsed, 2),
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[min(n - 1, int(n * 0.99))] * 1000, 1),
        "workflow_tasks": await workflow_tasks(handles[0]),
    }


async def workflow_tasks(handle: Any) -> int:
    """Completed workflow tasks in one closed workflow's history."""
    from temporalio.api.enums.v1 import EventType

    history = await handle.fetch_history()
    done = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    return sum(1 for e in history.events if e.event_type == done)


async def _serial(client: Client, shared: str, shape: str, n: int) -> float:
    """p50 (ms) of `n` workflows run one after another: the hand-off latency on a quiet
    engine, which a burst hides behind CPU saturation."""
    wf, _ = SHAPES[shape]
    latencies = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.execute_workflow(
            wf.run, shared, id=f"floor-{shape}-{uuid.uuid4().hex}", task_queue=shared
        )
        latencies.append(time.perf_counter() - t0)
    return round(statistics.median(latencies) * 1000, 1)


def mean(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.mean(r[k] for r in runs), 2) for k in runs[0]}


@contextlib.asynccontextmanager
async def floor_server(
    workers: int, transfer_rps: int, *, work: Path
) -> AsyncIterator[tuple[Client, str]]:
    """One fresh dev server (the stack's SQLite file and pragmas, the given transfer-queue read
    rate) with `workers` in-process workers polling it; yields its client and shared queue."""
    args = [
        "--db-filename",
        str(work / f"temporal-{transfer_rps}-{uuid.uuid4().hex[:6]}.db"),
        *TEMPORAL_SQLITE_PRAGMAS,
    ]
    if transfer_rps != DEFAULT_TRANSFER_RPS:
        args += ["--dynamic-config-value", f"history.transferProcessorMaxPollRPS={transfer_rps}"]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_log_level="error",
        ui=False,
        dev_server_extra_args=args,
    )
    try:
        shared = f"floor-{uuid.uuid4().hex[:8]}"
        async with _workers(env.client, shared, workers):
            yield env.client, shared
    finally:
        await env.shutdown()


async def measure(
    n: int, workers: int, rounds: int, transfer_rps: int, *, work: Path, serial: int
) -> Any:
    """Both shapes, alternated for `rounds` rounds of bursts, then `serial` one at a time, on
    one fresh dev server."""
    results: dict[str, list[dict[str, float]]] = {shape: [] for shape in SHAPES}
    async with floor_server(workers, transfer_rps, work=work) as (client, shared):
        await burst(client, shared, "today", min(n, 20))  # warm-up
        for r in range(rounds):
            order = list(SHAPES) if r % 2 == 0 else list(reversed(SHAPES))
            for shape in order:
                res = await burst(client, shared, shape, n)
                print(f"transfer_rps={transfer_rps} round {r + 1} {shape}: {res}", flush=True)
                results[shape].append(res)
        summary = {shape: mean(runs) for shape, runs in results.items()}
        for shape in SHAPES:
            summary[shape]["serial_p50_ms"] = await _serial(client, shared, shape, serial)
            print(f"transfer_rps={transfer_rps} one at a time {shape}: {summary[shape]}")
    return summary


async def run(
    n: int, workers: int, rounds: int, rps_values: list[int], serial: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "workers": workers, "rounds": rounds}
    out["loadavg_before"] = loadavg()
    with tempfile.TemporaryDirectory(prefix="floorbench-") as d:
        for rps in rps_values:
            by_shape = await measure(n, workers, rounds, rps, work=Path(d), serial=serial)
            out[f"transfer_rps_{rps}"] = {
                JSON_NAMES[shape]: by_shape[shape]
                for shape in ("today", "execute", "merged", "run")
            }
    out["loadavg_after"] = loadavg()
    return out


def table(result: dict[str, Any]) -> str:
    cols = ("throughput_per_s", "p50_ms", "p99_ms", "serial_p50_ms", "workflow_tasks")
    lines = [f"{'transfer rps':<13}{'shape':<16}" + "".join(f"{c:>18}" for c in cols)]
    for key, val in result.items():
        if key.startswith("transfer_rps_"):
            for name, stats in val.items():
                label = key.removeprefix("transfer_rps_")
                lines.append(f"{label:<13}{name:<16}" + "".join(f"{stats[c]:>18}" for c in cols))
    lines.append(f"loadavg before {result['loadavg_before']}  after {result['loadavg_after']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.floor", description=__doc__)
    parser.add_argument("--n", type=int, default=50, help="workflows per burst")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds per shape")
    parser.add_argument("--serial", type=int, default=20, help="one-at-a-time runs per shape")
    parser.add_argument(
        "--transfer-rps",
        default=f"{DEFAULT_TRANSFER_RPS},200",
        help="comma-separated history.transferProcessorMaxPollRPS values, one server each",
    )
    args = parser.parse_args(argv)
    try:
        rps = [int(v) for v in args.transfer_rps.split(",") if v.strip()]
    except ValueError:
        parser.error("--transfer-rps: comma-separated integers")
    sizes = (args.n, args.workers, args.rounds, args.serial)
    if min(sizes) < 1 or not rps or min(rps) < 1:
        parser.error("--n, --workers, --rounds, --serial and --transfer-rps must be at least 1")
    try:
        result = run_stoppable(run(args.n, args.workers, args.rounds, rps, args.serial))
    except KeyboardInterrupt:
        return interrupted()
    print(table(result), flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
