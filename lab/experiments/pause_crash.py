"""The experiments that prove the design on the real local stack.

* pause (UC-03): worker W1 claims a payout and is frozen with a real SIGSTOP between its grant
  check and its rail call; its lease expires server-side; W2 takes over with a higher token and
  pays; W1 is resumed and tries to submit. With fencing on, the rail proxy refuses W1's stale
  token and the payment database refuses W1's token for its next write; with fencing off (the
  FR-29 negative control) the rail moves the money a second time.
* crash (UC-04): a worker is SIGKILLed right after the payout reaches CLAIMED, RAIL_SUBMITTED or
  RAIL_ACKED; the next holder recovers by state and by the proxy's attempt record.

Each run writes its evidence (events, database extracts, the rail's movement log) to a folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from common.logs import get_logger
from stack.config import Ports, StackConfig
from stack.system import Stack

log = get_logger("lab.experiments")

LOCK_TTL_S = 3.0  # short leases so the experiment runs in seconds, not in A-04's 15 s
WORKER_ENV = {"WORKER_LOCK_TTL_S": str(LOCK_TTL_S), "WORKER_LOCK_HEARTBEAT_S": "0.75"}
FAST_WORKFLOW = {
    "acquire_wait_s": 30.0,
    "base_backoff_s": 0.2,
    "max_backoff_s": 1.0,
    "lookup_interval_s": 0.5,
    # Longer than W1's freeze, so that W1's request still has budget when it thaws and reaches
    # the fence check. (A pause past the deadline is refused even earlier, as DEADLINE_EXCEEDED.)
    "submit_deadline_s": 60.0,
    "holder_pickup_s": 3.0,
    "holder_heartbeat_timeout_s": 3.0,
}


class ExperimentError(RuntimeError):
    """The experiment could not run to its end (not: the design failed, which is a result)."""


async def _until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise ExperimentError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: 'T' means stopped (SIGSTOP)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def resumed_then_submitted(events: list[dict[str, Any]]) -> bool:
    """Whether a worker frozen by the UC-03 hook made its rail submission after it resumed."""
    resumed = [i for i, e in enumerate(events) if e.get("event") == "experiment.resumed"]
    return bool(resumed) and any(e.get("event") == "rail.submit" for e in events[resumed[0] :])


def json_events(path: Path) -> list[dict[str, Any]]:
    """The structured JSON events in a service log (other lines are skipped)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


async def _db_extract(database_url: str, payout_id: str, account_id: str) -> dict[str, Any]:
    conn = await asyncpg.connect(database_url)
    try:

        def rows(records: list[asyncpg.Record]) -> list[dict[str, Any]]:
            return [
                {k: (str(v) if not isinstance(v, int | str | None) else v) for k, v in r.items()}
                for r in records
            ]

        return {
            "payout": rows(
                await conn.fetch(
                    "SELECT payout_id, account_id, amount, state, fence, failure_reason"
                    " FROM paydb.payouts WHERE payout_id = $1",
                    payout_id,
                )
            ),
            "audit": rows(
                await conn.fetch(
                    "SELECT at, actor, token, action, from_state, to_state FROM paydb.audit_log"
                    " WHERE payout_id = $1 ORDER BY at, audit_id",
                    payout_id,
                )
            ),
            "ledger_entries": rows(
                await conn.fetch(
                    "SELECT e.group_id, e.account_id, e.amount FROM paydb.ledger_entries e"
                    " JOIN paydb.ledger_groups g ON g.group_id = e.group_id"
                    " WHERE g.payout_id = $1 ORDER BY e.account_id",
                    payout_id,
                )
            ),
            "balance": rows(
                await conn.fetch(
                    "SELECT account_id, balance, fence FROM paydb.balances WHERE account_id = $1",
                    account_id,
                )
            ),
            "proxy_attempts": rows(
                await conn.fetch(
                    "SELECT attempt_id, token, outcome, recorded_at, fencing_enforced,"
                    " guard_bypassed"
                    " FROM railproxy.attempts WHERE payout_id = $1 ORDER BY attempt_id",
                    payout_id,
                )
            ),
        }
    finally:
        await conn.close()


async def _movements(stack: Stack, client_reference: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(
        base_url=stack.railstub_url, timeout=5, headers=stack.operator_headers()
    ) as http:
        r = await http.get("/admin/movements", params={"client_reference": client_reference})
        r.raise_for_status()
        return [m for m in r.json()["movements"] if m["client_reference"] == client_reference]


async def _ledger_balanced(database_url: str) -> bool:
    from ledger.queries import ledger_discrepancies

    conn = await asyncpg.connect(database_url)
    try:
        return not await ledger_discrepancies(conn)
    finally:
        await conn.close()


async def _payout_row(database_url: str, payout_id: str) -> asyncpg.Record:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchrow(
            "SELECT state, fence FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
    finally:
        await conn.close()


async def _prepare(stack: Stack, amount: int, balance: int) -> tuple[str, str]:
    from payouts.batch import PayoutSpec
    from payouts.workload import create_payouts, seed_accounts

    run = uuid.uuid4().hex[:8]
    prefix = f"x{run}-"
    [account_id] = await seed_accounts(stack.role_dsn("PAYDB_DATABASE_URL"), 1, balance, prefix)
    payout_id = f"po-{run}"
    await create_payouts(
        stack.role_dsn("PAYDB_DATABASE_URL"), [PayoutSpec(payout_id, account_id, amount)]
    )
    return payout_id, account_id


async def _start_workflow(stack: Stack, payout_id: str, account_id: str) -> None:
    from payouts.batch import PayoutSpec
    from payouts.workload import start_workflows

    await start_workflows(
        stack.temporal_address,
        stack.config.task_queue,
        [PayoutSpec(payout_id, account_id, 0)],
        **FAST_WORKFLOW,
    )


async def workflow_timeline(address: str, workflow_id: str) -> list[dict[str, Any]]:
    """A workflow's history as [{s, event, activity, task_queue}], `s` seconds after its first
    event: e.g. how long a frozen worker's long-polls held its workflow tasks."""
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    out: list[dict[str, Any]] = []
    first = None
    for e in history.events:
        at = e.event_time.ToDatetime()
        first = first or at
        kind = e.WhichOneof("attributes") or ""
        attrs = getattr(e, kind, None)
        row: dict[str, Any] = {
            "s": round((at - first).total_seconds(), 3),
            "event": kind.removesuffix("_event_attributes"),
        }
        for f in ("activity_type", "task_queue"):
            if attrs is not None and attrs.DESCRIPTOR.fields_by_name.get(f) is not None:
                row[f] = getattr(attrs, f).name or None
        if kind.endswith("timed_out_event_attributes") or kind.endswith(
            "completed_event_attributes"
        ):
            row["scheduled_event_id"] = getattr(attrs, "scheduled_event_id", None)
        row["id"] = e.event_id
        out.append(row)
    return out


def _write_evidence(folder: Path, name: str, data: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data, indent=2, default=str, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- pause (UC-03)


@dataclass(frozen=True)
class _Takeover:
    """What the pause experiment's timeline produced: W1's token, W2's, and the takeover time."""

    payout_id: str
    account_id: str
    amount: int
    t1: int
    t2: int
    takeover_s: float
    #: When W2 was polling, seconds after the freeze: part of takeover_s, and on a loaded machine
    #: most of it (the engine-side takeover cannot finish before a second worker polls).
    w2_ready_s: float


#: The events of each process written to the pause experiment's events.json.
EVIDENCE_EVENTS = ("lock.", "rail.", "experiment.", "payout.", "fencing.", "submission_guard.")
FENCED_OUT_FIELDS = ("component", "key", "presented_token", "highest_token", "stored_token")
RAIL_SUBMIT_FIELDS = ("token", "code", "handoff_certainty", "outcome")


async def pause_experiment(
    config: StackConfig,
    *,
    fencing: bool,
    evidence_dir: Path,
    progress: Callable[[str], None] = lambda _s: None,
) -> dict[str, Any]:
    cfg = replace(config, workers=0, fencing=fencing)
    async with Stack(cfg, progress=progress) as stack:
        run = await _freeze_take_over_resume(stack, progress)
        paydb_probe = await _paydb_probe(stack.database_url, run.payout_id, run.t1, fencing)
        logs = {
            name: json_events(info.log_path)
            for name, info in stack.processes.items()
            if name in ("worker-W1", "worker-W2", "railproxy", "lock-server")
        }
        movements = await _movements(stack, run.payout_id)
        extract = await _db_extract(stack.database_url, run.payout_id, run.account_id)
        balanced = await _ledger_balanced(stack.database_url)
        result = _pause_result(
            cfg,
            run,
            logs=logs,
            movements=movements,
            extract=extract,
            balanced=balanced,
            paydb_probe=paydb_probe,
        )
        # Where the takeover's seconds went: the workflow's history, freeze onwards.
        result["timeline"] = await workflow_timeline(
            stack.temporal_address, f"payout-{run.payout_id}"
        )
        _write_evidence(evidence_dir, "result.json", result)
        _write_evidence(evidence_dir, "database.json", extract)
        _write_evidence(evidence_dir, "rail_movements.json", movements)
        events = {
            name: [e for e in evs if str(e.get("event", "")).startswith(EVIDENCE_EVENTS)]
            for name, evs in logs.items()
        }
        _write_evidence(evidence_dir, "events.json", events)
        return result


async def _freeze_take_over_resume(stack: Stack, progress: Callable[[str], None]) -> _Takeover:
    """The timeline: W1 claims and freezes, W2 takes over and posts, W1 resumes and attempts."""
    amount, balance = 2_500, 10_000
    payout_id, account_id = await _prepare(stack, amount, balance)
    progress(f"payout {payout_id} of {amount} on {account_id}; starting W1 (will freeze)")
    w1 = await stack.start_worker(
        "worker-W1", {**WORKER_ENV, "WORKER_EXPERIMENT_PAUSE_BEFORE_SUBMIT": "true"}
    )
    assert w1.pid is not None
    await _start_workflow(stack, payout_id, account_id)

    async def w1_frozen() -> bool:
        return process_state(w1.pid or 0) == "T"

    await _until("W1 to claim and freeze itself (SIGSTOP)", w1_frozen)
    frozen_at = time.monotonic()
    t1 = int((await _payout_row(stack.database_url, payout_id))["fence"])
    progress(
        f"W1 frozen after claiming with T1={t1}; its lease expires in {LOCK_TTL_S:.0f}s "
        "server-side; starting W2"
    )
    await stack.start_worker("worker-W2", WORKER_ENV)
    w2_ready_s = round(time.monotonic() - frozen_at, 1)

    async def posted() -> bool:
        return str((await _payout_row(stack.database_url, payout_id))["state"]) == "POSTED"

    await _until("W2 to execute the payout to POSTED", posted)
    takeover_s = round(time.monotonic() - frozen_at, 1)  # a figure, never asserted
    t2 = int((await _payout_row(stack.database_url, payout_id))["fence"])
    progress(f"W2 posted the payout with T2={t2} {takeover_s}s after W1 froze; resuming W1")
    stack.kill("worker-W1", signal.SIGCONT)
    w1_log = w1.log_path

    async def w1_attempted() -> bool:
        return resumed_then_submitted(json_events(w1_log))

    await _until("W1 to attempt its next step (the rail submission)", w1_attempted)
    # Let the proxy record W1's attempt's outcome (fencing off: the rail's answer).
    await asyncio.sleep(1.0)
    return _Takeover(payout_id, account_id, amount, t1, t2, takeover_s, w2_ready_s)


def _pause_result(
    cfg: StackConfig,
    run: _Takeover,
    *,
    logs: dict[str, list[dict[str, Any]]],
    movements: list[dict[str, Any]],
    extract: dict[str, Any],
    balanced: bool,
    paydb_probe: dict[str, Any],
) -> dict[str, Any]:
    """The pause experiment's figures from its evidence, with its checks and verdict."""
    fenced = [e for evs in logs.values() for e in evs if e.get("event") == "lock.fenced_out"]
    w1_events = logs.get("worker-W1", [])
    resumed = next((e for e in w1_events if e.get("event") == "experiment.resumed"), {})
    w1_submit = [e for e in w1_events if e.get("event") == "rail.submit"]
    ledger_debited = -sum(
        int(e["amount"]) for e in extract["ledger_entries"] if e["account_id"] == run.account_id
    )
    result = {
        "experiment": "pause",
        "fencing": "on" if cfg.fencing else "off",
        "backend": cfg.backend,
        "payout_id": run.payout_id,
        "account_id": run.account_id,
        "amount": run.amount,
        "t1": run.t1,
        "t2": run.t2,
        "takeover_s": run.takeover_s,
        "w2_ready_s": run.w2_ready_s,
        "final_state": extract["payout"][0]["state"],
        "rail_movements": len(movements),
        "rail_debited": sum(int(m["amount"]) for m in movements if m["status"] != "declined"),
        "ledger_debited": ledger_debited,
        "ledger_balanced": balanced,
        "fenced_out_events": len(fenced),
        "fenced_out": [{k: e.get(k) for k in FENCED_OUT_FIELDS} for e in fenced],
        "w1_still_held_after_resume": resumed.get("still_held"),
        "w1_rail_submit": [{k: e.get(k) for k in RAIL_SUBMIT_FIELDS} for e in w1_submit],
        "paydb_probe": paydb_probe,
    }
    result["checks"] = _pause_checks(result, cfg.fencing)
    result["ok"] = all(result["checks"].values())
    return result


async def _paydb_probe(database_url: str, payout_id: str, t1: int, fencing: bool) -> dict[str, Any]:
    """W1's next write at the first enforcement point, presented with W1's token T1.

    W1 itself stops at the proxy's refusal; this shows the payment database refuses the same
    token on its own, independently of the proxy (the two enforcement points are independent).
    """
    from ledger import AlreadyAdvanced, FencedOut, PayoutStore, WorkContext

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        store = PayoutStore(pool, enforce_fencing=fencing)
        ctx = WorkContext(correlation_id=payout_id, actor="experiment-probe-as-W1")
        try:
            result = await store.mark_submitted(payout_id, t1, ctx)
        except FencedOut as exc:
            return {
                "write": "mark_submitted",
                "token": t1,
                "result": "FencedOut",
                "detail": str(exc),
            }
        kind = "AlreadyAdvanced" if isinstance(result, AlreadyAdvanced) else "applied"
        return {
            "write": "mark_submitted",
            "token": t1,
            "result": kind,
            "state": str(getattr(result, "state", "")),
        }
    finally:
        await pool.close()


def _pause_checks(r: dict[str, Any], fencing: bool) -> dict[str, bool]:
    if fencing:
        return {
            "t2_above_t1": r["t2"] > r["t1"],
            "posted": r["final_state"] == "POSTED",
            "exactly_one_rail_movement": r["rail_movements"] == 1,
            "ledger_balanced": r["ledger_balanced"],
            "debited_once": r["ledger_debited"] == r["amount"] == r["rail_debited"],
            "one_fenced_out_event": r["fenced_out_events"] == 1,
            "w1_rejected_by_proxy": any(
                s.get("code") == "STALE_TOKEN" for s in r["w1_rail_submit"]
            ),
            "w1_rejected_by_paydb": r["paydb_probe"]["result"] == "FencedOut",
            "w1_observed_lock_lost": r["w1_still_held_after_resume"] is False,
        }
    # The negative control: the run must show the duplicate that fencing prevents.
    return {
        "t2_above_t1": r["t2"] > r["t1"],
        "two_rail_movements": r["rail_movements"] == 2,
        "account_debited_twice_at_the_rail": r["rail_debited"] == 2 * r["amount"],
        "w1_submission_accepted": any(s.get("code") is None for s in r["w1_rail_submit"]),
    }


# --------------------------------------------------------------------------- crash (UC-04)

CRASH_STATES = ("CLAIMED", "RAIL_SUBMITTED", "RAIL_ACKED")


async def crash_experiment(
    config: StackConfig,
    *,
    at: str,
    evidence_dir: Path,
    progress: Callable[[str], None] = lambda _s: None,
) -> dict[str, Any]:
    if at not in CRASH_STATES:
        raise ExperimentError(f"--at must be one of {', '.join(CRASH_STATES)}")
    cfg = replace(config, workers=0)
    amount = 1_500
    async with Stack(cfg, progress=progress) as stack:
        if at == "RAIL_SUBMITTED":
            # The rail records the movement and never answers: the proxy's outcome is UNKNOWN,
            # so the payout is RAIL_SUBMITTED with no known outcome when W1 dies.
            await _rail_rules(
                stack,
                {
                    "stall_s": 10.0,
                    "rules": [{"reference_prefix": "po-", "action": "timeout_after"}],
                },
            )
        payout_id, account_id = await _prepare(stack, amount, 10_000)
        w1 = await stack.start_worker("worker-W1", {**WORKER_ENV, "WORKER_EXPERIMENT_CRASH_AT": at})
        await _start_workflow(stack, payout_id, account_id)

        async def w1_dead() -> bool:
            return not w1.running()

        await _until(f"W1 to reach {at} and be SIGKILLed", w1_dead)
        at_crash = await _payout_row(stack.database_url, payout_id)
        state_at_crash, t1 = str(at_crash["state"]), int(at_crash["fence"])
        progress(f"W1 killed at {state_at_crash} (T1={t1}); starting W2 to recover")
        if at == "RAIL_SUBMITTED":
            await _rail_rules(stack, {"rules": []})
        await stack.start_worker("worker-W2", WORKER_ENV)

        async def terminal() -> bool:
            row = await _payout_row(stack.database_url, payout_id)
            return str(row["state"]) in ("POSTED", "FAILED", "ABANDONED")

        await _until("W2 to recover the payout to a terminal state", terminal)
        extract = await _db_extract(stack.database_url, payout_id, account_id)
        movements = await _movements(stack, payout_id)
        result = _crash_result(
            cfg,
            at,
            payout_id,
            state_at_crash=state_at_crash,
            t1=t1,
            extract=extract,
            movements=movements,
        )
        result["ledger_balanced"] = await _ledger_balanced(stack.database_url)
        result["checks"] = _crash_checks(result)
        result["ok"] = all(result["checks"].values())
        _write_evidence(evidence_dir, "result.json", result)
        _write_evidence(evidence_dir, "database.json", extract)
        _write_evidence(evidence_dir, "rail_movements.json", movements)
        return result


async def _rail_rules(stack: Stack, behaviour: dict[str, Any]) -> None:
    """Set the rail stub's behaviour (its operator-only admin endpoint)."""
    async with httpx.AsyncClient(
        base_url=stack.railstub_url, timeout=5, headers=stack.operator_headers()
    ) as http:
        await http.post("/admin/behaviour", json=behaviour)


def _crash_result(
    cfg: StackConfig,
    at: str,
    payout_id: str,
    *,
    state_at_crash: str,
    t1: int,
    extract: dict[str, Any],
    movements: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "experiment": "crash",
        "at": at,
        "backend": cfg.backend,
        "payout_id": payout_id,
        "state_at_crash": state_at_crash,
        "t1": t1,
        "t2": int(extract["payout"][0]["fence"]),
        "final_state": extract["payout"][0]["state"],
        "states": [a["to_state"] for a in extract["audit"] if a["to_state"]],
        "rail_movements": len(movements),
        "proxy_attempts": len(extract["proxy_attempts"]),
    }


def _crash_checks(r: dict[str, Any]) -> dict[str, bool]:
    checks = {
        "killed_at_state": r["state_at_crash"] == r["at"],
        "t2_above_t1": r["t2"] > r["t1"],
        "posted": r["final_state"] == "POSTED",
        "exactly_one_rail_movement": r["rail_movements"] == 1,
        "one_proxy_attempt": r["proxy_attempts"] == 1,
        "ledger_balanced": r["ledger_balanced"],
    }
    if r["at"] == "RAIL_SUBMITTED":
        checks["went_through_ambiguous"] = "RAIL_AMBIGUOUS" in r["states"]
    return checks


def isolated_ports() -> Ports:
    """Free ports for every service: an experiment never collides with a running `payouts up`."""
    return Ports.isolated()


def default_config(backend: str, run_dir: Path | None = None) -> StackConfig:
    run = run_dir or Path(os.environ.get("PAYOUTS_RUN_DIR", ".run")) / f"exp-{uuid.uuid4().hex[:6]}"
    return StackConfig.from_env(backend=backend, run_dir=run, workers=0, ports=isolated_ports())
