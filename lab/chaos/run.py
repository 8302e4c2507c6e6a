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

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import asyncpg
import httpx

from common.logs import get_logger
from invariants.blocked import HOLD_BOUND_S
from lab.chaos.downstream import downstream
from lab.chaos.faults import ChaosError, FaultInjector
from lab.chaos.locks import hold_source, wait_for_free_locks, workers_outage_window
from lab.chaos.rail import RAIL_BASELINE
from lab.chaos.replicas import HeldPayout
from lab.chaos.schedule import Fault, make_schedule
from lab.chaos.summary import TERMINAL, Evidence, summarize
from lab.experiments.evidence import json_events
from lab.experiments.harness import FAST_WORKFLOW, WORKER_ENV, isolated_ports
from stack.config import StackConfig
from stack.system import Stack

if TYPE_CHECKING:
    from payouts.batch import PayoutSpec

log = get_logger("lab.chaos")

#: FAST_WORKFLOW's short backoffs and holder timeouts. The submit deadline leaves an armed worker
#: frozen before its submission time for another worker to take the payout over and submit it
#: (the freeze ends then, chaos_faults), so its thawed request reaches the fence checks (fencing
#: on: refused as stale; off: the duplicate the negative control needs) instead of being refused
#: earlier as DEADLINE_EXCEEDED.
#: The resolution SLA is short enough that an ambiguity nothing can resolve escalates within the
#: run (INV-10 accepts RAIL_AMBIGUOUS only when escalated) and longer than a rail_slow payout
#: needs to resolve (the rail answers within submit deadline + 12 s), so those resolve first.
CHAOS_WORKFLOW = {**FAST_WORKFLOW, "submit_deadline_s": 90.0, "resolution_sla_s": 150.0}
#: The workers' session TTL (their lease). Longer than the experiments' 3 s so that the window
#: in which a lock-server outage fails a release while every session survives (longer than the
#: SDK's bounded retries, shorter than the TTL minus a heartbeat: lab.chaos.locks) holds a
#: restart of the lock server with room to spare, and reaches the 6-8 s outages of issue 24.
CHAOS_LOCK_TTL_S = 10.0
#: The submit deadline of the payout the armed pause #0 freezes on (see _start_under_faults).
ARMED_SUBMIT_DEADLINE_S = 600.0
CHAOS_WORKER_ENV = {**WORKER_ENV, "WORKER_LOCK_TTL_S": str(CHAOS_LOCK_TTL_S)}
ACCOUNT_BALANCE = 100_000_000  # minor units: funds never run out, so FAILED means a real refusal
MIN_AMOUNT, MAX_AMOUNT = 100, 5_000


@dataclass(frozen=True)
class ChaosOptions:
    payouts: int
    accounts: int
    workers: int
    seed: int
    backend: Literal["postgres", "etcd"] = "postgres"
    fencing: bool = True
    run_dir: Path | None = None
    #: Hard cap on settling after the last fault, however steady the progress.
    settle_timeout_s: float = 3600.0
    #: Settling fails once no payout changed state for this long while some are still open:
    #: the run is judged on progress, not on a guess of how fast this machine drains N payouts.
    #: Longer than the resolution SLA: an ambiguous payout's next change may be its escalation.
    stall_s: float = 240.0
    #: Escalated ambiguous payouts count as settled once no payout changed state for this long.
    quiet_s: float = 10.0
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    #: "sync": PostgreSQL on a primary with a synchronous standby (stack.replication), and the
    #: schedule gets a db_failover. The default: the production shape (issue 26).
    postgres_standby: Literal["none", "sync"] = "sync"
    #: Lock servers, rail proxies and outbox publishers each, behind the balancer (issue 26
    #: §1); 2 or more schedules the replica faults (lab.chaos.replicas).
    replicas: int = 2


def stack_config(opts: ChaosOptions) -> StackConfig:
    run_dir = opts.run_dir or Path(".run") / f"chaos-{opts.seed}-{uuid.uuid4().hex[:6]}"
    railstub_env = {
        "RAILSTUB_SEED": str(opts.seed),
        "RAILSTUB_LATENCY_MODE": "fixed",
        "RAILSTUB_LATENCY_FIXED_MS": str(RAIL_BASELINE["latency_fixed_ms"]),
        "RAILSTUB_AMBIGUITY_RATE": "0",
    }
    env = {"railstub": railstub_env, **opts.service_env}
    return StackConfig.from_env(
        # Embedded servers only: the run restarts PostgreSQL and kills etcd members itself.
        database_url=None,
        etcd_endpoints=None,
        backend=opts.backend,
        run_dir=run_dir,
        workers=0,
        fencing=opts.fencing,
        ports=isolated_ports(),
        etcd_members=3 if opts.backend == "etcd" else 1,
        postgres_standby=opts.postgres_standby,
        replicas=opts.replicas,
        service_env=env,
    )


async def _states(database_url: str, prefix: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT state FROM paydb.payouts WHERE starts_with(account_id, $1)", prefix
        )
    finally:
        await conn.close()
    return [str(r["state"]) for r in rows]


async def _db_now(database_url: str) -> Any:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT now()")
    finally:
        await conn.close()


#: A RAIL_AMBIGUOUS payout whose resolution SLA escalated (an `ambiguity_escalated` audit row):
#: an operator now owns it, so it no longer keeps the run from settling (INV-10).
ESCALATED = "RAIL_AMBIGUOUS:escalated"


async def _progress_states(database_url: str, prefix: str) -> list[str]:
    """Each payout's state, escalated ambiguity told apart (the escalation is a change too)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT p.state, EXISTS (SELECT 1 FROM paydb.audit_log a"
            "  WHERE a.payout_id = p.payout_id AND a.action = 'ambiguity_escalated') AS escalated"
            " FROM paydb.payouts p WHERE starts_with(p.account_id, $1)",
            prefix,
        )
    finally:
        await conn.close()
    return [
        ESCALATED if r["state"] == "RAIL_AMBIGUOUS" and r["escalated"] else str(r["state"])
        for r in rows
    ]


def _open(states: list[str]) -> int:
    """Payouts still moving: neither terminal nor escalated in RAIL_AMBIGUOUS."""
    return sum(1 for s in states if s not in TERMINAL and s != ESCALATED)


async def _settle(
    database_url: str, prefix: str, opts: ChaosOptions, progress: Callable[[str], None]
) -> bool:
    """Wait until every payout is terminal, or only escalated RAIL_AMBIGUOUS ones remain and
    nothing has changed for `quiet_s`. False (not settled) when nothing changed for `stall_s`
    while payouts were still open, or after `settle_timeout_s` in all."""
    deadline = time.monotonic() + opts.settle_timeout_s
    last: list[str] = []
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            states = sorted(await _progress_states(database_url, prefix))
            if states != last:
                last, last_change = states, time.monotonic()
        quiet = time.monotonic() - last_change
        if last and all(s in TERMINAL for s in last):
            return True
        if _open(last) == 0 and quiet >= opts.quiet_s:
            return True
        if quiet >= opts.stall_s:
            progress(f"no payout changed state for {quiet:.0f}s; {_open(last)} payout(s) open")
            return False
        await asyncio.sleep(1.0)
    progress(f"settle cap of {opts.settle_timeout_s:.0f}s spent; {_open(last)} payout(s) open")
    return False


async def _monitor(
    database_url: str,
    prefix: str,
    total: int,
    done: list[bool],
    progress: Callable[[str], None],
) -> None:
    """Progress lines: terminal counts every few seconds while the run goes on."""
    while True:
        await asyncio.sleep(5.0)
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            states = await _states(database_url, prefix)
            terminal = sum(1 for s in states if s in TERMINAL)
            ambiguous = states.count("RAIL_AMBIGUOUS")
            done[0] = terminal == total
            progress(f"progress: {terminal}/{total} terminal, {ambiguous} ambiguous")


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
        hold_back = _holds_back_one(schedule, opts)
        prefix, specs = await _create_workload(url, opts, hold_back)
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
        settled = await _start_under_faults(
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
        states = await _states(url, prefix)
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


def _holds_back_one(schedule: list[Fault], opts: ChaosOptions) -> bool:
    """Whether the proxy fault gets the workload's last payout to start (lab.chaos.replicas)."""
    return opts.payouts > 2 and any(f.kind == "proxy_replica_kill" for f in schedule)


async def _create_workload(
    url: str, opts: ChaosOptions, hold_back: bool
) -> tuple[str, list[PayoutSpec]]:
    """Funded accounts under a fresh prefix and the run's seeded payout rows (no workflows yet).
    With `hold_back`, the last payout is moved to an account of its own (`<prefix>k00000`): its
    lock is free when the proxy fault starts it, so its submission comes within seconds."""
    from payouts.batch import generate
    from payouts.workload import create_payouts, seed_accounts

    prefix = f"c{opts.seed}-{uuid.uuid4().hex[:6]}-"
    await seed_accounts(url, opts.accounts, ACCOUNT_BALANCE, prefix)
    specs = generate(
        opts.payouts,
        opts.accounts,
        seed=opts.seed,
        min_amount=MIN_AMOUNT,
        max_amount=MAX_AMOUNT,
        account_prefix=prefix,
    )
    if hold_back:
        (own,) = await seed_accounts(url, 1, ACCOUNT_BALANCE, f"{prefix}k")
        specs[-1] = replace(specs[-1], account_id=own)
    await create_payouts(url, specs)
    return prefix, specs


async def _start_under_faults(
    stack: Stack,
    injector: FaultInjector,
    opts: ChaosOptions,
    schedule: list[Fault],
    specs: list[PayoutSpec],
    *,
    prefix: str,
    done: list[bool],
    hold_back: bool,
    progress: Callable[[str], None],
) -> bool:
    """Start the fleet and the workflows, fire every fault, restore, settle; True if settled.
    With `hold_back`, the last payout waits for the proxy fault (lab.chaos.replicas)."""
    from payouts.workload import start_workflows

    await injector.rail(RAIL_BASELINE)
    # Fault #0, the armed pause, by construction (the fencing-off control rests on it): its
    # worker starts alone and is handed the workload's first payout, so it is the one that
    # claims it and freezes just before submitting; the fleet and the rest of the workload start
    # only then. That payout's submit deadline is long (ARMED_SUBMIT_DEADLINE_S): the frozen
    # request is thawed only once a newer holder's submission of it is recorded (chaos_faults),
    # and however slow the takeover (a loaded machine, an open breaker, an outage) its request
    # must still be inside its deadline then, to reach the fence checks.
    armed = await injector.arm(schedule[0])
    # The absence rule proves nothing about times before the rail's records begin (minus
    # its skew margin): a workload started sooner would leave lost instructions ambiguous.
    await stack.wait_for_rail_history()
    progress(f"starting {opts.payouts} payout workflows on {opts.accounts} accounts")
    address, queue = stack.temporal_address, stack.config.task_queue
    first = {**CHAOS_WORKFLOW, "submit_deadline_s": ARMED_SUBMIT_DEADLINE_S}
    # The proxy fault's payout (lab.chaos.replicas): the workload's last, started by the fault
    # itself once the rail is slowed, so that a submission is in flight when it kills a proxy;
    # started after the schedule at the latest, so every payout of the run always runs.
    held = specs[-1:] if hold_back else []
    rest = specs[1 : len(specs) - len(held)]
    started_held = asyncio.Event()

    async def start_held() -> None:
        if not started_held.is_set():
            await start_workflows(address, queue, held, **CHAOS_WORKFLOW)
            started_held.set()

    injector.replicas.held_payout = HeldPayout(held[0].payout_id, start_held) if held else None
    t0 = time.monotonic()
    await start_workflows(address, queue, specs[:1], **first)
    url = stack.database_url
    monitor = asyncio.create_task(_monitor(url, prefix, opts.payouts, done, progress))
    try:
        await injector.fire(schedule[0], t0, armed=armed)
        await injector.armed_frozen(schedule[0])
        await injector.start_fleet(opts.workers)
        await start_workflows(address, queue, rest, **CHAOS_WORKFLOW)
        await injector.run(schedule[1:], t0)
        if held:
            await start_held()
        progress("all faults fired; restoring normal behaviour and letting the system settle")
        await injector.restore()
        return await _settle(url, prefix, opts, progress)
    finally:
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
        await injector.close()
