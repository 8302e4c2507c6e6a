"""The game day's scenarios: one per alert of ops/prometheus/rules.yml (NFR-11).

Owns: for each scenario, causing its condition for real against a running `Stack` (reusing the
chaos fault helpers where they exist), the runbook's confirm step (the same commands
docs/runbooks/ tells an operator to run, run here as subprocesses), and the recovery. Must
never: resubmit a payout, touch a payout's state by hand, or revoke a lock (the runbooks forbid
the first two; the game day needs none of them to recover).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Any

import httpx

from common.lockkey import lock_key
from lab.chaos.faults import FaultInjector
from lab.chaos.rail import RAIL_BASELINE
from lab.chaos.schedule import Fault
from lab.experiments.evidence import json_events
from lab.experiments.harness import FAST_WORKFLOW, LOCK_TTL_S, WORKER_ENV
from lab.gameday.ctx import Ctx, Scenario
from lab.gameday.runbooks import OVERRIDE_PREFIX
from lab.gameday.scratch import ScratchReconciler

# ---------------------------------------------------------------- metrics target down


async def _freeze_outbox(ctx: Ctx) -> None:
    ctx.stack.kill("outbox", signal.SIGSTOP)  # a real stop-the-world pause: scrapes time out


async def _confirm_target_down(ctx: Ctx) -> bool:
    # Runbook: curl the target's /metrics; a frozen process accepts the connection, answers nothing.
    url = f"{ctx.stack.processes['outbox'].url}/metrics"
    try:
        await ctx.http.get(url, timeout=2.0)
    except httpx.HTTPError:
        return True
    return False


async def _thaw_outbox(ctx: Ctx) -> None:
    ctx.stack.kill("outbox", signal.SIGCONT)


# ---------------------------------------------------------------- outbox


async def _finledger_faults(ctx: Ctx, faults: dict[str, Any]) -> None:
    url = f"{ctx.stack.finledger_url}/admin/faults"
    # The finance ledger's admin API takes operators only (as the rail stub's does).
    headers = ctx.stack.operator_headers()
    (await ctx.http.put(url, json=faults, headers=headers)).raise_for_status()


async def _outbox_permanent(ctx: Ctx) -> None:
    # Finance's chart of accounts no longer knows the account: every write answers 404, which
    # the publisher classifies as permanent and dead-letters at once.
    await _finledger_faults(ctx, {"unknown_account_prefixes": ["gd"]})
    await ctx.payouts(1)


async def _confirm_dead_letters(ctx: Ctx) -> bool:
    rc, out = await ctx.command(
        "-m", "payouts.cli", "outbox", "list", "--status", "delivery_failed", "--json"
    )
    return rc == 0 and json.loads(out.splitlines()[-1])["summary"]["delivery_failed"] > 0


async def _outbox_down(ctx: Ctx) -> None:
    await _finledger_faults(ctx, {"down": True})  # every write 503: transient, rows stay pending
    await ctx.payouts(1)


async def _confirm_outbox_pending(ctx: Ctx) -> bool:
    rc, out = await ctx.command(
        "-m", "payouts.cli", "outbox", "list", "--status", "pending", "--json"
    )
    return rc == 0 and json.loads(out.splitlines()[-1])["summary"]["pending"] > 0


async def _finledger_up(ctx: Ctx) -> None:
    await _finledger_faults(ctx, {})


# ---------------------------------------------------------------- rail


async def _rail_outage(ctx: Ctx) -> None:
    await ctx.faults.rail({"outage": True})
    await ctx.payouts(8)  # forwards that fail open the breaker (STD01-08)


async def _confirm_circuit(ctx: Ctx) -> bool:
    health = (await ctx.http.get(f"{ctx.stack.railproxy_url}/health")).json()
    return '"OPEN"' in json.dumps(health)  # the breaker state the proxy reports


async def _rail_baseline(ctx: Ctx) -> None:
    await ctx.faults.rail(RAIL_BASELINE)


async def _rail_slow(ctx: Ctx) -> None:
    await ctx.faults.rail({"latency_mode": "fixed", "latency_fixed_ms": 2500})
    ctx.background(_batches(ctx, 3, every_s=2.0))


async def _batches(ctx: Ctx, times: int, *, every_s: float) -> None:
    for _ in range(times):
        await ctx.payouts(3)
        await asyncio.sleep(every_s)


async def _confirm_slow(ctx: Ctx) -> bool:
    rows = await ctx.prom.query("payouts:payout_latency_slow:ratio_rate5m")
    return bool(rows) and float(rows[0]["value"][1]) > 0.144


async def _ambiguous(ctx: Ctx) -> None:
    # Every submission's answer is lost (the rail moved the money, the proxy times out), and the
    # rail's lookups lag (A-08 visibility delay): nothing can settle it until the lag ends. The
    # game day recovers well inside the proxy's absence window (ingest bound + skew margin), so
    # the lookup finds the movement rather than concluding "absent".
    await ctx.faults.rail({"ambiguity_rate": 1.0, "visibility_delay_s": 3600.0})
    await ctx.payouts(1)
    await _until_state(ctx, "RAIL_AMBIGUOUS", 60.0)


async def _until_state(ctx: Ctx, state: str, within_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if await _count_state(ctx, state) > 0:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"no payout reached {state} within {within_s:.0f}s")


async def _count_state(ctx: Ctx, state: str) -> int:
    rc, out = await ctx.command("-m", "payouts.cli", "payout", "list", "--state", state, "--json")
    return len(json.loads(out)) if rc == 0 else 0


async def _confirm_ambiguous(ctx: Ctx) -> bool:
    return await _count_state(ctx, "RAIL_AMBIGUOUS") > 0


# ---------------------------------------------------------------- locks


async def _lose_etcd_quorum(ctx: Ctx) -> None:
    for name in ctx.stack.etcd_member_names[1:]:
        await ctx.stack.stop_etcd_member(name, signal.SIGKILL)
    await ctx.payouts(3)
    ctx.background(_probes(ctx))


async def _probes(ctx: Ctx) -> None:
    while True:  # probes, as a load balancer's would; each one an acquire attempt
        await ctx.faults.probe_acquire()
        await asyncio.sleep(0.5)


async def _confirm_lock_down(ctx: Ctx) -> bool:
    rc, out = await ctx.command("-m", "lockservice", "inspect", lock_key("gameday-probe"))
    pending = await _count_state(ctx, "PENDING")
    ctx.notes.append(f"inspect rc={rc}: {out.strip()[-120:]}; PENDING={pending}")
    return rc != 0 and pending > 0


async def _restore_etcd_quorum(ctx: Ctx) -> None:
    await ctx.cancel_background()
    for name in ctx.stack.etcd_member_names[1:]:
        await ctx.stack.start_etcd_member(name)
    await _probe_until_ok(ctx, 60.0)


async def _probe_until_ok(ctx: Ctx, within_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if await ctx.faults.probe_acquire():
            for _ in range(10):  # successful acquires bring the short window's ratio down
                await ctx.faults.probe_acquire()
            return
        await asyncio.sleep(0.5)


async def _leader_kills(ctx: Ctx) -> None:
    for _ in range(2):  # two elections inside the (shortened) day: over budget
        await ctx.faults.etcd_leader_kill()


async def _confirm_leader_changes(ctx: Ctx) -> bool:
    rows = await ctx.prom.query("max(etcd_server_leader_changes_seen_total)")
    return bool(rows) and float(rows[0]["value"][1]) >= 2


async def _nothing(ctx: Ctx) -> None:
    """The elections are over; the alert resolves once they leave the window."""


# ---------------------------------------------------------------- fencing (NFR-06, UC-03)


async def _fenced_out_write(ctx: Ctx) -> None:
    """A worker armed with the UC-03 hook freezes itself (SIGSTOP) holding a payout's grant,
    just before its rail submission; its 3 s lease expires, the stack's worker takes the payout
    over under a newer token and submits it; the armed worker is thawed and its stale submission
    is refused at the rail proxy (STALE_TOKEN), and any stale write at the payment database is
    fenced out too. What prevents a second movement of money: the proxy's per-account token
    high-water mark and the payment database's fence (FR-17), neither touched here."""
    inj = FaultInjector(
        ctx.stack, worker_env=dict(WORKER_ENV), lease_s=LOCK_TTL_S, progress=ctx.notes.append
    )
    fault = Fault(index=0, kind="pause", at_s=0.0, armed=True)
    triggered = inj.armed.triggered[0] = asyncio.Event()
    pause: asyncio.Future[dict[str, Any]] | None = None
    try:
        # A worker of the stack: the shipped config's worker job scrapes it while it lives (its
        # paydb_fenced_out_total is the second enforcement point's).
        armed = await inj.arm(fault)
        ctx.prom.refresh_targets()
        pause = asyncio.ensure_future(inj.armed.pause(fault, armed))
        while not triggered.is_set():  # one payout at a time until the armed worker takes one
            await ctx.payouts(1, workflow=FAST_WORKFLOW)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(triggered.wait()), 2.0)
        record = await pause
    finally:
        if pause is not None and not pause.done():  # its own finally thaws and stops the worker
            pause.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pause
        await inj.close()
    ctx.notes.append(f"armed pause: {record}")
    if not (record.get("triggered") and record.get("taken_over") and record.get("stale_attempt")):
        raise RuntimeError(f"no stale attempt after a takeover: {record}")


async def _confirm_fenced_out(ctx: Ctx) -> bool:
    # Runbook: `lock.fenced_out` events in the logs, then `payouts check-invariants` exits 0.
    logs = [p.log_path for n, p in ctx.stack.processes.items() if n in ("railproxy", "lock-server")]
    logs += sorted(ctx.stack.config.run_dir.glob("**/worker-*.log"))
    fenced = [e for path in logs for e in json_events(path) if e.get("event") == "lock.fenced_out"]
    # With etcd the grants live in etcd: the checker reads them from the lock server's history.
    history = ["--history", "http"] if ctx.stack.config.backend == "etcd" else []
    rc, out = await ctx.command(
        "-m", "payouts.cli", "check-invariants", *history, timeout_s=120.0
    )  # fmt: skip
    ctx.notes.append(
        f"lock.fenced_out events: {len(fenced)}; check-invariants rc={rc}"
        + ("" if rc == 0 else f": {out.strip()[-300:]}")
    )
    return bool(fenced) and rc == 0


# ---------------------------------------------------------------- reconciliation (UC-07)


async def _plant_discrepancy(ctx: Ctx) -> None:
    """A scratch database (never the stack's payment database) where a payout claims POSTED
    with no rail movement; the real reconciler runs against it and exports what it found."""
    scratch = ScratchReconciler(ctx.stack.database_url, ctx.stack.server_context("worker"))
    ctx.scratch = scratch
    scratch.start()
    # In production the workers serve reconcile_* (the ReconcileWorkflow runs there): the
    # exporter is one more target of the shipped worker job, not a job of its own.
    ctx.prom.extra_targets["worker"] = [scratch.url.split("://", 1)[1]]
    ctx.prom.refresh_targets()
    await scratch.create()
    await scratch.plant()
    report = await scratch.run()
    if report.ok:
        raise RuntimeError("the reconciler found nothing in the planted scratch database")
    ctx.notes.append(f"scratch reconcile: {report.counts}")


async def _confirm_discrepancy(ctx: Ctx) -> bool:
    # Runbook: `payouts reconcile run` (read-only; exit 1 with the classes and a sample).
    scratch = ctx.scratch
    if scratch is None:
        return False
    window = scratch.window()
    rc, out = await ctx.command(
        "-m", "payouts.cli", "reconcile", "run", "--json",
        "--window-start", window.start.isoformat(), "--window-end", window.end.isoformat(),
        "--rail-admin-url", scratch.url,
        env={"RECONCILE_DATABASE_URL": scratch.dsn, "DATABASE_URL": scratch.dsn},
    )  # fmt: skip
    if rc != 1:
        ctx.notes.append(f"reconcile run rc={rc}: {out.strip()[-200:]}")
        return False
    report = json.loads(out.strip().splitlines()[-1])
    return scratch.planted in {i for ids in report["samples"].values() for i in ids}


def _scratch_world(ctx: Ctx) -> dict[str, str]:
    """The runbook's reconciliation commands read the scratch world, not the stack's."""
    scratch = ctx.scratch
    if scratch is None:
        return {}
    return {
        f"{OVERRIDE_PREFIX}RECONCILE_DATABASE_URL": scratch.dsn,
        f"{OVERRIDE_PREFIX}RECONCILE_RAIL_ADMIN_URL": scratch.url,
    }


async def _drop_scratch(ctx: Ctx) -> None:
    """Drop the planted database; the reconciler's next run (on a freshly migrated scratch
    database, with nothing false in it) reports zero for every class."""
    scratch = ctx.scratch
    if scratch is None:
        return
    await scratch.drop()
    await scratch.create()
    report = await scratch.run()
    if not report.ok:
        raise RuntimeError(f"discrepancies in a fresh scratch database: {report.counts}")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "metrics target frozen (outbox publisher SIGSTOP)",
        ("MetricsTargetDown",),
        _freeze_outbox, _confirm_target_down, _thaw_outbox, short=True,
    ),
    Scenario(
        "outbox downstream returns permanent errors (404)",
        ("OutboxDeadLetters",),
        # Finance opens the account; the runbook's Do step (`payouts outbox retry`) is the
        # operator's part of the recovery.
        _outbox_permanent, _confirm_dead_letters, _finledger_up, short=True,
    ),
    Scenario(
        "rail outage: breaker opens",
        ("RailCircuitOpen",),
        _rail_outage, _confirm_circuit, _rail_baseline,
        tolerated=("PayoutLatencyFastBurn", "PayoutLatencySlowBurn"), short=True,
    ),
    Scenario(
        "outbox downstream down (503)",
        ("OutboxDeliveryAgeHigh",),
        _outbox_down, _confirm_outbox_pending, _finledger_up,
    ),
    Scenario(
        "rail slow (2.5 s per submission)",
        ("PayoutLatencyFastBurn", "PayoutLatencySlowBurn"),
        _rail_slow, _confirm_slow, _rail_baseline,
    ),
    Scenario(
        "ambiguity left unresolved past a shortened SLA",
        ("RailAmbiguousPastSla",),
        _ambiguous, _confirm_ambiguous, _rail_baseline,
        tolerated=("RailCircuitOpen", "PayoutLatencyFastBurn", "PayoutLatencySlowBurn"),
    ),
    Scenario(
        "lock backend down (etcd quorum lost)",
        ("LockAcquireAvailabilityFastBurn", "LockAcquireAvailabilitySlowBurn",
         "PayoutBacklogAgeHigh"),
        _lose_etcd_quorum, _confirm_lock_down, _restore_etcd_quorum,
        tolerated=("MetricsTargetDown", "PayoutLatencyFastBurn", "PayoutLatencySlowBurn",
                   "EtcdLeaderElectionsOverBudget"),
        etcd=True,
    ),
    Scenario(
        "etcd leader killed twice",
        ("EtcdLeaderElectionsOverBudget",),
        _leader_kills, _confirm_leader_changes, _nothing,
        tolerated=("MetricsTargetDown", "LockAcquireAvailabilityFastBurn",
                   "LockAcquireAvailabilitySlowBurn"),
        etcd=True,
    ),
    Scenario(
        "worker frozen past its lease holding a grant (armed SIGSTOP before submit)",
        ("FencedOutWrite",),
        _fenced_out_write, _confirm_fenced_out, _nothing,
        tolerated=("MetricsTargetDown", "PayoutLatencyFastBurn", "PayoutLatencySlowBurn"),
        fire_within_s=240.0,
    ),
    Scenario(
        "discrepancy planted in a scratch database (POSTED, no rail movement)",
        ("ReconciliationDiscrepancies",),
        _plant_discrepancy, _confirm_discrepancy, _drop_scratch,
        runbook_env=_scratch_world,
    ),
)  # fmt: skip
