"""`payouts-lab demo` (what `make demo` runs): the main job on embedded defaults.

Starts the local stack, seeds accounts, runs a mixed workload (200 payouts over 50 accounts by
default, the rail at nominal latency with 0.5% ambiguity and some declines), runs the UC-03 pause
experiment with fencing on, reconciles, checks every invariant, and prints a readable report.
Exits 0 only if every check in the report holds. The report's text: lab.demo.report.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from lab.demo.report import counts_in_words, rail_outcomes
from lab.experiments.evidence import json_events
from lab.experiments.harness import isolated_ports
from lab.experiments.pause import pause_experiment
from payouts.batch import generate
from payouts.follow import settle_payouts, terminal_count
from payouts.trace_cli import payout_waterfalls
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.config import StackConfig
from stack.system import Stack


@dataclass
class DemoOptions:
    payouts: int = 200
    accounts: int = 50
    workers: int = 3
    backend: str = "postgres"
    decline_rate: float = 0.02
    ambiguity_rate: float = 0.005
    seed: int = 7
    settle_timeout_s: float = 600.0
    run_dir: Path = field(default_factory=lambda: Path(".run") / "demo")
    pause_experiment: bool = True


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def _latencies(database_url: str, ids: list[str]) -> tuple[list[float], list[float]]:
    """Seconds per POSTED payout, from the payment database's clock: end to end (created ->
    POSTED, which includes waiting behind the account's earlier payouts: one in flight per
    account, A-15) and execution (claimed -> POSTED, the critical section NFR-04 is about)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT EXTRACT(EPOCH FROM (p.updated_at - p.created_at))::float8 AS e2e,"
            " EXTRACT(EPOCH FROM (p.updated_at - c.at))::float8 AS exec"
            " FROM paydb.payouts p JOIN LATERAL (SELECT max(at) AS at FROM paydb.audit_log a"
            "  WHERE a.payout_id = p.payout_id AND a.to_state = 'CLAIMED') c ON true"
            " WHERE p.payout_id = ANY($1::text[]) AND p.state = 'POSTED'",
            ids,
        )
        return sorted(float(r["e2e"]) for r in rows), sorted(float(r["exec"]) for r in rows)
    finally:
        await conn.close()


async def _movements(railstub_url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every instruction the rail recorded, with its status (settled, pending, declined)."""
    async with httpx.AsyncClient(base_url=railstub_url, timeout=10, headers=headers) as http:
        r = await http.get("/admin/movements")
        r.raise_for_status()
        movements: list[dict[str, Any]] = r.json()["movements"]
        return movements


PAUSE_FIGURES = (
    "t1",
    "t2",
    "rail_movements",
    "ledger_balanced",
    "fenced_out_events",
    "final_state",
    "ok",
)


async def run_demo(options: DemoOptions, progress: Callable[[str], None]) -> dict[str, Any]:
    config = _stack_config(options)
    report: dict[str, Any] = {"options": {k: str(v) for k, v in vars(options).items()}}
    started = time.monotonic()
    async with Stack(config, progress=progress) as stack:
        report["ui"] = stack.ui_url
        progress(f"stack is up; Temporal UI at {stack.ui_url}")
        ids, window_start, states = await _workload(stack, config, options, progress)
        report["workload_s"] = round(time.monotonic() - started, 1)
        report["states"] = dict(states)
        report["latency_s"] = await _latency_report(stack.database_url, ids)
        # Settled and declined apart: a decline is recorded by the rail, but no money moved.
        movements = await _movements(stack.railstub_url, stack.operator_headers())
        report["rail"] = rail_outcomes(movements, ids)
        await asyncio.sleep(2.0)  # let the reconciliation window close past the last write
        settled = terminal_count(dict(states)) == len(ids)
        report.update(await _reconcile_and_check(stack, window_start, settled=settled))
        report["fenced_out_in_workload"] = sum(
            1
            for info in stack.processes.values()
            for e in json_events(info.log_path)
            if e.get("event") == "lock.fenced_out"
        )
        report["outbox"] = await _outbox(stack)
    if options.pause_experiment:
        report["pause_experiment"] = await _pause(options, config, progress)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    report["checks"] = [vars(c) for c in _checks(report, options, ids)]
    report["ok"] = all(c["ok"] for c in report["checks"])
    return report


def _stack_config(options: DemoOptions) -> StackConfig:
    service_env = {
        "railstub": {
            "RAILSTUB_AMBIGUITY_RATE": str(options.ambiguity_rate),
            "RAILSTUB_DECLINE_RATE": str(options.decline_rate),
            "RAILSTUB_SEED": str(options.seed),
        },
    }
    return StackConfig.from_env(
        run_dir=options.run_dir / f"stack-{uuid.uuid4().hex[:6]}",
        workers=options.workers,
        backend=options.backend,
        service_env=service_env,
    )


async def _latency_report(database_url: str, ids: list[str]) -> dict[str, Any]:
    e2e, execution = await _latencies(database_url, ids)
    return {
        "p50": round(_pct(e2e, 50), 3),
        "p99": round(_pct(e2e, 99), 3),
        "exec_p50": round(_pct(execution, 50), 3),
        "exec_p99": round(_pct(execution, 99), 3),
        "n": len(e2e),
    }


async def _reconcile_and_check(
    stack: Stack, window_start: datetime, *, settled: bool
) -> dict[str, Any]:
    """The reconciler's and the invariant checker's counts over the workload's window."""
    from invariants.checker import (
        check_invariants,
        postgres_grant_source,
        temporal_workflow_source,
    )
    from reconcile.reconciler import reconcile, stub_movement_source
    from reconcile.rules import Window

    # Reconciler and checker read only, as the checker's read-only role.
    conn = await asyncpg.connect(stack.role_dsn("CHECKER_DATABASE_URL"))
    try:
        window = Window(start=window_start, end=datetime.now(UTC) - timedelta(seconds=1))
        rec = await reconcile(
            conn,
            stub_movement_source(stack.railstub_url, token=stack.token("reconciler")),
            window,
        )
        inv = await check_invariants(
            conn,
            stub_movement_source(stack.railstub_url, token=stack.token("invariants")),
            postgres_grant_source(stack.role_dsn("CHECKER_DATABASE_URL")),
            workflow_source=temporal_workflow_source(stack.temporal_address),
            # Settled only when the workload drained: then INV-10 also demands that every
            # payout be terminal or escalated (the "every payout terminal" check is stricter).
            settled=settled,
        )
    finally:
        await conn.close()
    return {
        "reconcile": dict(rec.counts),
        "invariants": inv.counts(),
        "invariants_not_checked": list(inv.not_checked),
    }


async def _pause(
    options: DemoOptions, config: StackConfig, progress: Callable[[str], None]
) -> dict[str, Any]:
    progress("running the UC-03 pause experiment with fencing on (its own stack)")
    exp_cfg = replace(
        config,
        run_dir=options.run_dir / f"pause-{uuid.uuid4().hex[:6]}",
        ports=isolated_ports(),
        workers=0,
        service_env={},
    )
    pause = await pause_experiment(
        exp_cfg,
        fencing=True,
        evidence_dir=options.run_dir / "evidence-pause",
        progress=progress,
    )
    figures = {k: pause[k] for k in PAUSE_FIGURES}
    # Its trace: the start (this process), both workers, the fenced-out resume, every hop.
    # (run_dir holds this process's spans, lab.demo.cli, and the experiment stack's.)
    figures["trace"] = "\n\n".join(payout_waterfalls(options.run_dir, pause["payout_id"]))
    return figures


async def _workload(
    stack: Stack, config: StackConfig, options: DemoOptions, progress: Callable[[str], None]
) -> tuple[list[str], datetime, Counter[str]]:
    """Seed, create and start the payouts, then show progress until all are terminal."""
    prefix = f"d{uuid.uuid4().hex[:5]}-"
    await seed_accounts(stack.role_dsn("PAYDB_DATABASE_URL"), options.accounts, 1_000_000, prefix)
    specs = generate(
        options.payouts,
        options.accounts,
        seed=options.seed,
        min_amount=100,
        max_amount=5_000,
        account_prefix=prefix,
    )
    ids = [s.payout_id for s in specs]
    window_start = datetime.now(UTC) - timedelta(seconds=1)
    await create_payouts(stack.role_dsn("PAYDB_DATABASE_URL"), specs)
    await stack.wait_for_rail_history()  # see Stack.wait_for_rail_history: sound absence
    await start_workflows(stack.temporal_address, config.task_queue, specs, lookup_interval_s=2.0)
    progress(
        f"started {len(specs)} payouts over {options.accounts} accounts "
        f"with {options.workers} workers"
    )
    conn = await asyncpg.connect(stack.database_url)
    try:
        states = await settle_payouts(
            conn, ids, timeout_s=options.settle_timeout_s, progress=progress
        )
    finally:
        await conn.close()
    return ids, window_start, states


async def _outbox(stack: Stack) -> dict[str, Any]:
    try:
        from outbox.ops import outbox_summary
    except ImportError:
        return {"available": False}
    if not stack.finledger_url:
        return {"available": False}
    pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=2)
    try:
        postings = int(
            await pool.fetchval(
                "SELECT count(*) FROM paydb.outbox WHERE event_type = 'ledger.posted'"
            )
        )
        # The publisher drains in the background: give it a bounded time to catch up.
        summary: dict[str, Any] = {}
        downstream = records = -1
        for _ in range(60):
            summary = await outbox_summary(pool)
            async with httpx.AsyncClient(
                base_url=stack.finledger_url, timeout=10, headers=stack.operator_headers()
            ) as http:
                book = (await http.get("/v1/records")).json()["records"]
            records = len(book)
            downstream = sum(1 for r in book if r["event_type"] == "ledger.posted")
            if downstream >= postings and not summary.get("pending"):
                break
            await asyncio.sleep(1.0)
        return {
            "available": True,
            "summary": summary,
            "postings": postings,
            "downstream_postings": downstream,
            "downstream_records": records,
        }
    finally:
        await pool.close()


def _checks(report: dict[str, Any], options: DemoOptions, ids: list[str]) -> list[Check]:
    states: dict[str, int] = report["states"]
    terminal = terminal_count(dict(states))
    rail: dict[str, int] = report["rail"]
    posted = states.get("POSTED", 0)
    checks = [
        Check("every payout terminal", terminal == len(ids), f"{terminal} of {len(ids)}"),
        Check(
            "no payout paid twice",
            rail["more_than_one"] == 0,
            f"{rail['more_than_one']} payouts instructed at the rail more than once",
        ),
        Check(
            "posted payouts paid once",
            posted <= rail["settled"],
            f"{rail['settled']} payouts settled once at the rail, {posted} POSTED",
        ),
        Check(
            "reconciliation clean",
            not any(report["reconcile"].values()),
            counts_in_words(report["reconcile"], "no discrepancy"),
        ),
        Check(
            "invariants INV-01..INV-10 hold",
            not any(report["invariants"].values()),
            counts_in_words(report["invariants"], "0 violations"),
        ),
        Check(
            "no fenced-out write in the normal workload",
            report["fenced_out_in_workload"] == 0,
            f"{report['fenced_out_in_workload']} fenced-out events",
        ),
    ]
    outbox = report["outbox"]
    if outbox.get("available"):
        summary = outbox["summary"]
        drained = summary.get("pending") == 0 and summary.get("delivery_failed") == 0
        checks += [
            Check(
                "outbox delivered every posting once",
                outbox["downstream_postings"] == outbox["postings"],
                f"{outbox['downstream_postings']} ledger.posted records booked by the finance "
                f"ledger for {outbox['postings']} ledger.posted events in the outbox",
            ),
            Check(
                "outbox drained, nothing dead-lettered",
                drained and outbox["downstream_records"] == summary.get("delivered"),
                f"{summary.get('delivered')} rows delivered, "
                f"{outbox['downstream_records']} records downstream, "
                f"{summary.get('pending')} pending, {summary.get('delivery_failed')} dead-lettered",
            ),
        ]
    if "pause_experiment" in report:
        p = report["pause_experiment"]
        checks.append(
            Check(
                "pause experiment: stale worker fenced out",
                bool(p["ok"]),
                f"token T1={p['t1']} refused after T2={p['t2']}, "
                f"{p['rail_movements']} rail movement(s), {p['fenced_out_events']} fenced-out "
                "event(s)",
            )
        )
    return checks
