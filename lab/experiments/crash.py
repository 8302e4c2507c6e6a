"""The crash experiment (UC-04, `payouts-lab experiment crash --at STATE`) on the real local
stack: a worker is SIGKILLed right after the payout reaches CLAIMED, RAIL_SUBMITTED or
RAIL_ACKED; the next holder recovers by state and by the proxy's attempt record.

The run writes its evidence (database extracts, the rail's movement log) to a folder
(lab.experiments.evidence).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from lab.experiments.evidence import db_extract, ledger_balanced, rail_movements, write_evidence
from lab.experiments.harness import (
    WORKER_ENV,
    ExperimentError,
    payout_row,
    prepare_payout,
    start_workflow,
    until,
)
from stack.config import StackConfig
from stack.system import Stack

__all__ = ["CRASH_STATES", "crash_experiment"]

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
        payout_id, account_id = await prepare_payout(stack, amount, 10_000)
        w1 = await stack.start_worker("worker-W1", {**WORKER_ENV, "WORKER_EXPERIMENT_CRASH_AT": at})
        await start_workflow(stack, payout_id, account_id)

        async def w1_dead() -> bool:
            return not w1.running()

        await until(f"W1 to reach {at} and be SIGKILLed", w1_dead)
        at_crash = await payout_row(stack.database_url, payout_id)
        state_at_crash, t1 = str(at_crash["state"]), int(at_crash["fence"])
        progress(f"W1 killed at {state_at_crash} (T1={t1}); starting W2 to recover")
        if at == "RAIL_SUBMITTED":
            await _rail_rules(stack, {"rules": []})
        await stack.start_worker("worker-W2", WORKER_ENV)

        async def terminal() -> bool:
            row = await payout_row(stack.database_url, payout_id)
            return str(row["state"]) in ("POSTED", "FAILED", "ABANDONED")

        await until("W2 to recover the payout to a terminal state", terminal)
        extract = await db_extract(stack.database_url, payout_id, account_id)
        movements = await rail_movements(stack, payout_id)
        result = _crash_result(
            cfg,
            at,
            payout_id,
            state_at_crash=state_at_crash,
            t1=t1,
            extract=extract,
            movements=movements,
        )
        result["ledger_balanced"] = await ledger_balanced(stack.database_url)
        result["checks"] = _crash_checks(result)
        result["ok"] = all(result["checks"].values())
        write_evidence(evidence_dir, "result.json", result)
        write_evidence(evidence_dir, "database.json", extract)
        write_evidence(evidence_dir, "rail_movements.json", movements)
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
