"""The hot account of `make bench-e2e` (issue 29, A-15): N payouts on ONE account drain one at a
time, by design (the account's lock serialises them), so the best they can do is the rail's
pace, N x the rail's latency. How close they come, and the same N spread over N accounts.

Owns: the `hot` section's figures, measured on a stack that bench_e2e started: drain time (the
database clock when the workflows are started to the last terminal audit row), the rail limit
(N x latency), their ratio (goal >= 0.9), and the hand-off between consecutive holders read
from the rail stub's own movement log: the time from one payout's answer at the rail
(recorded_at + latency) to the next payout's instruction arriving there. Must never: assert a
timing (it reports figures), or create a payout on an account another section uses.
"""

from __future__ import annotations

import itertools
import statistics
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import httpx

from lab.bench.stats import nearest_rank
from ledger.states import TERMINAL_STATES
from payouts.batch import PayoutSpec
from payouts.follow import settle_payouts
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.system import Stack

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HotTarget:
    """What the section needs of a started stack (bench_e2e's System, without importing it)."""

    stack: Stack
    client: Any
    pool: asyncpg.Pool
    settle_timeout_s: float


async def _drain(
    target: HotTarget, specs: list[PayoutSpec], what: str, progress: Progress
) -> tuple[float | None, dict[str, int]]:
    """Start every payout at once; seconds from the start (database clock) to the last
    terminal audit row (None if none ended), and the terminal states."""
    ids = [s.payout_id for s in specs]
    await create_payouts(target.stack.database_url, specs)
    t0 = await target.pool.fetchval("SELECT clock_timestamp()")
    await start_workflows(
        target.stack.temporal_address, target.stack.config.task_queue, specs, client=target.client
    )
    states = await settle_payouts(
        target.pool,
        ids,
        timeout_s=target.settle_timeout_s,
        progress=progress,
        interval_s=0.5,
        label=f"{what}: ",
    )
    last = await target.pool.fetchval(
        "SELECT max(at) FROM paydb.audit_log WHERE payout_id = ANY($1::text[])"
        " AND to_state = ANY($2::text[])",
        ids,
        [str(s) for s in TERMINAL_STATES],
    )
    drain_s = (last - t0).total_seconds() if last is not None else None
    return drain_s, dict(states)


async def _client_references(target: HotTarget, specs: list[PayoutSpec]) -> set[str]:
    """What the payouts were submitted to the rail as (the stub's log is keyed by it)."""
    rows = await target.pool.fetch(
        "SELECT client_reference FROM paydb.payouts WHERE payout_id = ANY($1::text[])",
        [s.payout_id for s in specs],
    )
    return {r["client_reference"] for r in rows if r["client_reference"]}


async def _handoffs_ms(stack: Stack, refs: set[str], latency_ms: int) -> list[float]:
    """Per consecutive pair of the hot account's instructions at the rail: the next one's
    arrival minus the previous one's answer (its arrival + the fixed latency), in ms."""
    async with httpx.AsyncClient(
        base_url=stack.railstub_url, timeout=30, headers=stack.operator_headers()
    ) as http:
        r = await http.get("/admin/movements")
        r.raise_for_status()
    arrivals = sorted(
        datetime.fromisoformat(m["recorded_at"]).timestamp()
        for m in r.json()["movements"]
        if m["client_reference"] in refs
    )
    return [round((b - a) * 1000 - latency_ms, 1) for a, b in itertools.pairwise(arrivals)]


async def hot_account(
    target: HotTarget, n: int, latency_ms: int, progress: Progress
) -> dict[str, Any]:
    """N payouts on one account against the rail's pace, then the same N over N accounts."""
    run = uuid.uuid4().hex[:6]
    (account,) = await seed_accounts(target.stack.database_url, 1, 10_000_000, f"hot{run}-")
    hot = [PayoutSpec(f"po-hot-{run}-{i:05d}", account, 1_000 + i) for i in range(n)]
    progress(f"hot: {n} payouts on one account, rail fixed at {latency_ms} ms")
    drain_s, states = await _drain(target, hot, "hot", progress)
    refs = await _client_references(target, hot)
    handoffs = await _handoffs_ms(target.stack, refs, latency_ms)
    spread_accounts = await seed_accounts(target.stack.database_url, n, 100_000, f"spr{run}-")
    spread = [
        PayoutSpec(f"po-spr-{run}-{i:05d}", a, 1_000 + i) for i, a in enumerate(spread_accounts)
    ]
    progress(f"hot: the same {n} payouts over {n} accounts")
    spread_s, spread_states = await _drain(target, spread, "hot spread", progress)
    limit_s = n * latency_ms / 1000
    return {
        "n": n,
        "rail_latency_ms": latency_ms,
        "rail_limit_s": round(limit_s, 2),
        "drain_s": None if drain_s is None else round(drain_s, 2),
        # The goal (issue 29): >= 0.9, i.e. drained within N x latency / 0.9.
        "pace_ratio": round(limit_s / drain_s, 3) if drain_s else None,
        "overhead_ms_per_payout": (
            None if drain_s is None else round((drain_s - limit_s) * 1000 / n, 1)
        ),
        # Never below 0 while the account's payouts are serialised: the next instruction
        # cannot reach the rail before the previous one's answer came back.
        "handoff_min_ms": min(handoffs) if handoffs else None,
        "handoff_p50_ms": nearest_rank(handoffs, 50),
        "handoff_p99_ms": nearest_rank(handoffs, 99),
        "handoff_mean_ms": round(statistics.mean(handoffs), 1) if handoffs else None,
        "states": states,
        "spread_drain_s": None if spread_s is None else round(spread_s, 2),
        "spread_states": spread_states,
        # The hot account's payouts, for their statements (lab.bench.e2e pops it off the JSON).
        "payout_ids": [s.payout_id for s in hot],
    }


def hot_line(h: dict[str, Any]) -> str:
    """One line of bench_e2e's table."""
    return (
        f"hot account: {h['n']} payouts drained in {h['drain_s']} s against the rail's"
        f" {h['rail_limit_s']} s ({h['n']} x {h['rail_latency_ms']} ms): pace ratio"
        f" {h['pace_ratio']} (goal >= 0.9), {h['overhead_ms_per_payout']} ms per payout over the"
        f" rail; hand-off p50 {h['handoff_p50_ms']} / p99 {h['handoff_p99_ms']} ms; spread over"
        f" {h['n']} accounts: {h['spread_drain_s']} s; states {h['states']}"
    )
