"""`payouts-lab chaos`: a seeded fault-injection run over the whole local stack (issue 7,
STD01-13/14).

Starts a private stack on free ports, seeds accounts, creates and starts payouts, and injects
faults on a schedule derived only from the seed (lab.chaos.schedule): worker pauses longer
than the lease (some armed with the UC-03 hook, to hit the check-then-act gap for sure), worker
kills, lock-server restarts, backend restarts (PostgreSQL, or the etcd leader of a 3-member
cluster), a PostgreSQL failover to its synchronous standby (`--postgres-standby sync`), Temporal
and rail stub crashes (SIGKILL, restart on the same files), rail outages,
ambiguity, slow lookups, rail latency beyond the submit deadline and rail clock skew. Then it
restores normal behaviour, lets the system settle, and runs the reconciler and the invariant
checker (INV-01..INV-10, with Temporal's record of the payout workflows) over the run.

Owns: the run's orchestration and evidence gathering. Must never: repair what it finds (the
reconciler and the checker are read-only), or run against anything but its own stack.
"""

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
import httpx

from common.logs import get_logger
from invariants.evidence import HOLD_BOUND_S
from lab.chaos.downstream import downstream
from lab.chaos.faults import ChaosError, FaultInjector
from lab.chaos.locks import hold_source, wait_for_free_locks, workers_outage_window
from lab.chaos.options import (
    CHAOS_LOCK_TTL_S,
    CHAOS_WORKER_ENV,
    CHAOS_WORKFLOW,
    ChaosOptions,
    stack_config,
)
from lab.chaos.schedule import make_schedule
from lab.chaos.settle import payout_states
from lab.chaos.summary import Evidence, summarize
from lab.chaos.workload import create_workload, holds_back_one, start_under_faults
from lab.experiments.evidence import json_events
from stack.system import Stack

__all__ = ["run_chaos"]

log = get_logger("lab.chaos")


async def _db_now(database_url: str) -> Any:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT now()")
    finally:
        await conn.close()


async def _movement_references(railstub_url: str, headers: dict[str, str]) -> list[str]:
    async with httpx.AsyncClient(base_url=railstub_url, timeout=30, headers=headers) as http:
        r = await http.get("/admin/movements")
        r.raise_for_status()
        return [str(m["client_reference"]) for m in r.json()["movements"]]


def _service_events(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """JSON events of every service log of the run (replaced workers' logs included)."""
    logs = stack.run_dir / "logs"
    return {p.stem: json_events(p) for p in sorted(logs.glob("*.log"))}


async def _check(stack: Stack, window_start: Any, *, settled: bool) -> tuple[Any, Any]:
    from invariants.checker import (
        check_invariants,
        lock_server_grant_source,
        postgres_grant_source,
        temporal_workflow_source,
    )
    from reconcile.reconciler import reconcile, stub_movement_source
    from reconcile.rules import Window

    movements = stub_movement_source(stack.railstub_url, token=stack.token("invariants"))
    grants = (
        postgres_grant_source(stack.role_dsn("CHECKER_DATABASE_URL"))
        if stack.config.backend == "postgres"
        else lock_server_grant_source(stack.lock_url, token=stack.token("invariants"))
    )
    # Reconciler and checker read only, as the checker's read-only role.
    conn = await asyncpg.connect(stack.role_dsn("CHECKER_DATABASE_URL"))
    try:
        end = await conn.fetchval("SELECT now()")
        window = Window(start=window_start - timedelta(seconds=1), end=end)
        rec = await reconcile(conn, movements, window)
        inv = await check_invariants(
            conn,
            movements,
            grants,
            workflow_source=temporal_workflow_source(stack.temporal_address),
            # Only a run that settled may demand "terminal or escalated" of every payout; one
            # that did not is reported as partial, and the rule is listed as not checked.
            settled=settled,
            hold_source=hold_source(stack),
            hold_bound_s=HOLD_BOUND_S,
        )
    finally:
        await conn.close()
    return rec, inv


async def _wait_for_rail_answers(injector: FaultInjector, progress: Callable[[str], None]) -> None:
    """A rail_slow window's submissions may still be in the rail's hands (a payout can be
    terminal, e.g. FAILED by an unsound "absent", while the rail has yet to settle it): the
    rail's log is complete evidence only once it answered them all."""
    rail_wait = injector.rail_answered_by - time.monotonic()
    if rail_wait > 0:
        progress(f"waiting {rail_wait:.0f}s for the rail to answer the slowed submissions")
        await asyncio.sleep(rail_wait)


async def run_chaos(
    opts: ChaosOptions, progress: Callable[[str], None] = lambda _s: None
) -> dict[str, Any]:
    """One seeded chaos run; returns the summary (lab.chaos.summary.summarize)."""
    outage_window = workers_outage_window(CHAOS_WORKER_ENV)
    schedule = make_schedule(
        opts.seed,
        workers=opts.workers,
        payouts=opts.payouts,
        lock_outage_s=outage_window,
        lease_s=CHAOS_LOCK_TTL_S,
        db_failover=opts.postgres_standby == "sync",
        replicas=opts.replicas,
        backend=opts.backend,
    )
    progress(
        f"seed {opts.seed}: {len(schedule)} faults scheduled (lock-server outages inside"
        f" {outage_window[0]}-{outage_window[1]}s)"
    )
    for f in schedule:
        progress(f"  {f.describe()}")
    started = time.monotonic()
    config = stack_config(opts)
    async with Stack(config, progress=lambda line: progress(f"stack: {line}")) as stack:
        url, run_dir = stack.database_url, stack.run_dir
        window_start = await _db_now(url)
        hold_back = holds_back_one(schedule, opts)
        prefix, specs = await create_workload(url, opts, hold_back)
        done = [False]
        injector = FaultInjector(
            stack,
            worker_env=dict(CHAOS_WORKER_ENV),
            lease_s=CHAOS_LOCK_TTL_S,
            progress=progress,
            workload_done=lambda: done[0],
            submit_deadline_s=CHAOS_WORKFLOW["submit_deadline_s"],
            lock_outage_s=outage_window,
        )
        settled = await start_under_faults(
            stack,
            injector,
            opts,
            schedule,
            specs,
            prefix=prefix,
            done=done,
            hold_back=hold_back,
            progress=progress,
        )
        await _wait_for_rail_answers(injector, progress)
        accounts = sorted({s.account_id for s in specs})
        await wait_for_free_locks(hold_source(stack), accounts, HOLD_BOUND_S, progress)
        states = await payout_states(url, prefix)
        progress("running reconciliation and the invariant checker")
        rec, inv = await _check(stack, window_start, settled=settled)
        references = await _movement_references(stack.railstub_url, stack.operator_headers())
        postings = await downstream(stack, progress)
        events = _service_events(stack)
        if len(states) != opts.payouts:
            raise ChaosError(f"expected {opts.payouts} payouts, found {len(states)}")
    evidence = Evidence(
        seed=opts.seed,
        backend=opts.backend,
        fencing=opts.fencing,
        payouts=opts.payouts,
        accounts=opts.accounts,
        workers=opts.workers,
        states=states,
        movement_references=references,
        events=events,
        invariant_counts=inv.counts(),
        invariant_samples={r.invariant: r.sample for r in inv.results},
        invariants_not_checked=list(inv.not_checked),
        reconcile_counts=rec.counts,
        faults_fired=injector.records,
        schedule=[f.as_dict() for f in schedule],
        elapsed_s=time.monotonic() - started,
        settled=settled,
        leader_changes=injector.leader_changes,
        workers_replaced=injector.workers_replaced,
        held_payout_locks=int(inv.checked.get("held_payout_locks", 0)),
        downstream=postings,
        topology={"replicas": opts.replicas, "postgres_standby": opts.postgres_standby},
    )
    summary = summarize(evidence)
    summary["run_dir"] = str(run_dir)
    log.info(
        "chaos.finished",
        seed=opts.seed,
        backend=opts.backend,
        fencing=opts.fencing,
        violations_total=summary["violations_total"],
        exit_code=summary["exit_code"],
    )
    return summary
