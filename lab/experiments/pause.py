"""The pause experiment (UC-03, `payouts-lab experiment pause`) on the real local stack.

Worker W1 claims a payout and is frozen with a real SIGSTOP between its grant check and its rail
call; its lease expires server-side; W2 takes over with a higher token and pays; W1 is resumed
and tries to submit. With fencing on, the rail proxy refuses W1's stale token and the payment
database refuses W1's token for its next write; with fencing off (the FR-29 negative control)
the rail moves the money a second time.

The run writes its evidence (events, database extracts, the rail's movement log) to a folder
(lab.experiments.evidence).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import asyncpg

from lab.experiments.evidence import (
    db_extract,
    json_events,
    ledger_balanced,
    rail_movements,
    resumed_then_submitted,
    workflow_timeline,
    write_evidence,
)
from lab.experiments.harness import (
    LOCK_TTL_S,
    WORKER_ENV,
    payout_row,
    prepare_payout,
    process_state,
    start_workflow,
    until,
)
from stack.config import StackConfig
from stack.system import Stack

__all__ = ["EVIDENCE_EVENTS", "pause_experiment"]


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
        movements = await rail_movements(stack, run.payout_id)
        extract = await db_extract(stack.database_url, run.payout_id, run.account_id)
        balanced = await ledger_balanced(stack.database_url)
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
        write_evidence(evidence_dir, "result.json", result)
        write_evidence(evidence_dir, "database.json", extract)
        write_evidence(evidence_dir, "rail_movements.json", movements)
        events = {
            name: [e for e in evs if str(e.get("event", "")).startswith(EVIDENCE_EVENTS)]
            for name, evs in logs.items()
        }
        write_evidence(evidence_dir, "events.json", events)
        return result


async def _freeze_take_over_resume(stack: Stack, progress: Callable[[str], None]) -> _Takeover:
    """The timeline: W1 claims and freezes, W2 takes over and posts, W1 resumes and attempts."""
    amount, balance = 2_500, 10_000
    payout_id, account_id = await prepare_payout(stack, amount, balance)
    progress(f"payout {payout_id} of {amount} on {account_id}; starting W1 (will freeze)")
    w1 = await stack.start_worker(
        "worker-W1", {**WORKER_ENV, "WORKER_EXPERIMENT_PAUSE_BEFORE_SUBMIT": "true"}
    )
    assert w1.pid is not None
    await start_workflow(stack, payout_id, account_id)

    async def w1_frozen() -> bool:
        return process_state(w1.pid or 0) == "T"

    await until("W1 to claim and freeze itself (SIGSTOP)", w1_frozen)
    frozen_at = time.monotonic()
    t1 = int((await payout_row(stack.database_url, payout_id))["fence"])
    progress(
        f"W1 frozen after claiming with T1={t1}; its lease expires in {LOCK_TTL_S:.0f}s "
        "server-side; starting W2"
    )
    await stack.start_worker("worker-W2", WORKER_ENV)
    w2_ready_s = round(time.monotonic() - frozen_at, 1)

    async def posted() -> bool:
        return str((await payout_row(stack.database_url, payout_id))["state"]) == "POSTED"

    await until("W2 to execute the payout to POSTED", posted)
    takeover_s = round(time.monotonic() - frozen_at, 1)  # a figure, never asserted
    t2 = int((await payout_row(stack.database_url, payout_id))["fence"])
    progress(f"W2 posted the payout with T2={t2} {takeover_s}s after W1 froze; resuming W1")
    stack.kill("worker-W1", signal.SIGCONT)
    w1_log = w1.log_path

    async def w1_attempted() -> bool:
        return resumed_then_submitted(json_events(w1_log))

    await until("W1 to attempt its next step (the rail submission)", w1_attempted)
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
