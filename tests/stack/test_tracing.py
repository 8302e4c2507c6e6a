"""One trace per payout across every process, on the real local stack (issue 27 §2).

The stack runs as shipped (`stack.system.Stack`: its services write their spans under the run
directory); payouts are started by real processes (the `payouts` console command, a starter
script), and the assertions read the trace files those processes wrote (common.tracefile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from common.tracefile import SpanRecord, orphans, payout_trace_ids, read_spans, trace_of
from stack.cli import export_env
from stack.config import Ports, StackConfig
from stack.embedded.shared import free_port
from stack.system import Stack
from tests.stack.conftest import ID_LABELS, external_database, metrics_endpoints
from tests.waiting import wait_for
from workflows.payout import PayoutWorkflow

pytestmark = pytest.mark.slow

#: Every process a payout passes through, by the service name its spans carry.
PROCESSES = {"payouts-cli", "worker", "lock-server", "railproxy", "railstub", "outbox", "finledger"}

#: A payout of this id is recorded by the rail, answered ambiguously, and invisible to lookups.
AMBIGUOUS_RULE = {"reference_prefix": "amb-", "action": "ambiguous"}

#: Starts one payout's workflow as `payouts.workload` does, in a process of its own that traces
#: (the root of the trace), with lookups every 0.3 s and a continue-as-new after every second.
STARTER = """
import asyncio, sys
from common import tracing
from payouts.batch import PayoutSpec
from payouts.workload import start_workflows
tracing.setup("payouts-cli")
address, queue, payout_id, account_id = sys.argv[1:5]
asyncio.run(start_workflows(address, queue, [PayoutSpec(payout_id, account_id, 0)],
    lookup_interval_s=0.3, max_lookups_per_run=2, resolution_sla_s=3600))
tracing.shutdown()
"""


@pytest.fixture(scope="module")
async def stack(run_dir: Path) -> AsyncIterator[Stack]:
    """One stack with one worker for the module; the rail stub answers `amb-` payouts
    ambiguously and keeps every movement out of lookups for an hour."""
    # As tests/stack/conftest.py's stack_env, for a module: every port free, never a default.
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.pop("ETCD_ENDPOINTS", None)
    for key, var in Ports.ENV_VARS.items():
        env[var] = "0" if key.startswith("worker_") else str(free_port())
    folder = run_dir / f"tracing-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    async with external_database("payouts_tracing") as database_url:
        config = StackConfig.from_env(env, run_dir=folder, workers=1, database_url=database_url)
        async with Stack(config) as started:
            await _rail(started, {"rules": [AMBIGUOUS_RULE], "visibility_delay_s": 3600})
            await started.wait_for_rail_history()
            yield started


async def _rail(stack: Stack, patch: dict[str, object]) -> None:
    async with httpx.AsyncClient(base_url=stack.railstub_url, timeout=10) as http:
        r = await http.post("/admin/behaviour", json=patch, headers=stack.operator_headers())
        r.raise_for_status()


def _cli(stack: Stack, *args: str) -> str:
    """`payouts ...` as an operator's shell runs it, with the exports `payouts up` prints."""
    done = subprocess.run(
        [sys.executable, "-m", "payouts.cli", *args],
        env={**os.environ, **export_env(stack)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _start_with_fast_lookups(stack: Stack, payout_id: str, account_id: str) -> None:
    """The STARTER script in a process of its own."""
    args = [stack.temporal_address, stack.config.task_queue, payout_id, account_id]
    done = subprocess.run(
        [sys.executable, "-c", STARTER, *args],
        env={**os.environ, **export_env(stack)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _traces(stack: Stack) -> Path:
    return stack.config.run_dir / "traces"


def _by_id(trace: list[SpanRecord]) -> dict[str, SpanRecord]:
    return {s.span_id: s for s in trace}


async def _the_trace(stack: Stack, payout_id: str, done: set[str]) -> list[SpanRecord]:
    """The payout's one trace once it holds a span of each process in `done` and no orphan
    (every process flushes within about a second; bounded generously for a loaded machine)."""
    found: list[SpanRecord] = []

    async def complete() -> bool:
        nonlocal found
        spans = read_spans(_traces(stack))
        ids = payout_trace_ids(spans, payout_id)
        found = trace_of(spans, ids[0]) if len(ids) == 1 else []
        return done <= {s.service for s in found} and not orphans(found)

    try:
        await wait_for(complete, timeout_s=90, every_s=0.5)
    except AssertionError:
        lost = [(s.name, s.process) for s in orphans(found)]
        seen = sorted({s.service for s in found})
        raise AssertionError(f"trace incomplete: services {seen}, orphans {lost}") from None
    return found


async def _posted_and_delivered(stack: Stack, payout_id: str) -> None:
    conn = await asyncpg.connect(stack.database_url)
    try:

        async def settled() -> bool:
            state = await conn.fetchval(
                "SELECT state FROM paydb.payouts WHERE payout_id = $1", payout_id
            )
            pending = await conn.fetchval(
                "SELECT count(*) FROM paydb.outbox WHERE payload->>'payout_id' = $1"
                " AND status <> 'delivered'",
                payout_id,
            )
            return bool(state == "POSTED" and pending == 0)

        await wait_for(settled, timeout_s=120, every_s=0.3)
    finally:
        await conn.close()


def _parent(trace: list[SpanRecord], span: SpanRecord) -> SpanRecord:
    assert span.parent_id is not None, span
    return _by_id(trace)[span.parent_id]


def _assert_hops(trace: list[SpanRecord]) -> None:
    """Each hop's server side is the child of its caller's client span, in the caller's
    process: the context crossed every process boundary, not just the trace id."""
    root = next(s for s in trace if s.parent_id is None)
    assert (root.name, root.service) == ("payout.start", "payouts-cli")
    for s in trace:
        if s.name.startswith("RunWorkflow:"):
            assert _parent(trace, s).name == "StartWorkflow:PayoutWorkflow"
        if s.name.startswith("RunActivity:"):
            assert _parent(trace, s).name == s.name.replace("Run", "Start", 1)
        if s.kind == "SERVER" and s.service in ("lock-server", "railproxy"):
            assert (_parent(trace, s).service, _parent(trace, s).kind) == ("worker", "CLIENT")
        if s.kind == "SERVER" and s.service == "railstub":
            assert (_parent(trace, s).service, _parent(trace, s).kind) == ("railproxy", "CLIENT")
        if s.name == "finledger.book":
            assert _parent(trace, s).name == "outbox.deliver"
        if s.name == "outbox.deliver":
            assert _parent(trace, s).service == "worker"  # where the row was staged
    statements = {s.service for s in trace if s.is_statement}
    assert {"worker", "railproxy", "lock-server"} <= statements  # every database hop


def _events_in(stack: Stack, trace_id: str) -> set[str]:
    """The processes whose JSON log has an event carrying `trace_id`."""
    out = set()
    for name, info in stack.processes.items():
        if info.log_path is None or not Path(info.log_path).exists():
            continue
        for line in Path(info.log_path).read_text(errors="replace").splitlines():
            if trace_id in line and json.loads(line).get("trace_id") == trace_id:
                out.add("worker" if name.startswith("worker") else name)
                break
    return out


async def test_one_payout_is_one_trace_through_every_process(stack: Stack) -> None:
    """A payout created and started by `payouts payout create` is one trace holding spans of
    every process it went through (starter, worker, lock server, rail proxy, rail stub, outbox
    publisher, finance ledger) and their database statements, each hop parented to its caller,
    no orphan; their log events carry the trace id, and no metric label carries it (NFR-09)."""
    prefix = f"tr{uuid.uuid4().hex[:6]}-"
    _cli(stack, "seed", "--accounts", "1", "--balance", "100000", "--prefix", prefix)
    payout_id = f"{prefix}p"
    _cli(stack, "payout", "create", "--account", f"{prefix}00000", "--amount", "250",
         "--payout-id", payout_id)  # fmt: skip
    await _posted_and_delivered(stack, payout_id)
    trace = await _the_trace(stack, payout_id, PROCESSES)
    _assert_hops(trace)
    trace_id = trace[0].trace_id
    assert {"worker", "lock-server", "railproxy", "finledger", "outbox"} <= _events_in(
        stack, trace_id
    )
    out = _cli(stack, "payout", "trace", payout_id)  # the waterfall, from the same files
    assert f"trace {trace_id}" in out and "RunActivity:acquire_and_execute" in out
    async with httpx.AsyncClient(timeout=10) as http:
        for name, url in metrics_endpoints(stack).items():
            text = (await http.get(url)).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    assert not ID_LABELS & set(sample.labels), (name, sample)
                    assert not {trace_id, payout_id} & set(sample.labels.values()), (name, sample)


async def test_an_ambiguous_payout_keeps_its_trace_across_continue_as_new(stack: Stack) -> None:
    """A payout that went RAIL_AMBIGUOUS looks the rail up run after run (a continue-as-new
    every second lookup): every run's workflow span and every lookup, with the rail proxy's and
    the rail stub's handling of it, is in the payout's one trace."""
    prefix = f"amb-{uuid.uuid4().hex[:6]}-"
    _cli(stack, "seed", "--accounts", "1", "--balance", "100000", "--prefix", prefix)
    payout_id = f"{prefix}p"
    _cli(stack, "payout", "create", "--no-start", "--account", f"{prefix}00000",
         "--amount", "300", "--payout-id", payout_id)  # fmt: skip
    _start_with_fast_lookups(stack, payout_id, f"{prefix}00000")
    client = await Client.connect(stack.temporal_address)
    handle = client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")

    async def third_run() -> bool:
        status = await handle.query(PayoutWorkflow.status)
        return status.state == "RAIL_AMBIGUOUS" and status.runs >= 3

    await wait_for(third_run, timeout_s=120, every_s=0.5)
    spans: list[SpanRecord] = []

    async def lookups_of_three_runs() -> bool:
        nonlocal spans
        spans = await _the_trace(stack, payout_id, {"payouts-cli", "worker", "railproxy"})
        lookups = [s for s in spans if s.name == "RunActivity:lookup_rail"]
        return len({s.attributes.get("temporalRunID") for s in lookups}) >= 3

    await wait_for(lookups_of_three_runs, timeout_s=90, every_s=0.5)
    runs = {s.attributes["temporalRunID"] for s in spans if s.name.startswith("RunWorkflow:")}
    assert len(runs) >= 3  # one workflow span per run, all in this trace
    for lookup in (s for s in spans if s.name == "RunActivity:lookup_rail"):
        assert _parent(spans, lookup).name == "StartActivity:lookup_rail"
    served = [s for s in spans if s.kind == "SERVER" and s.service == "railproxy"]
    assert len(served) >= 3 and not orphans(spans)
    await handle.terminate("test over")
