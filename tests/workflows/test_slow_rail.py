"""Issue 12 item 1 on the real stack (Temporal dev server, PostgreSQL, lock server, rail proxy
and rail stub as processes, the real activities): a rail slower than the submit deadline, with
early and frequent lookups, never gets a payout FAILED or ABANDONED that it paid.

The rail here is slow (latency = submit deadline + 7 s, so every forward times out UNKNOWN), its
lookup is eventually consistent (a movement is invisible for 7 s) and its clock runs 7 s ahead
(as far ahead as the visibility delay, so that the old rule's claim is false for the whole time
a movement is invisible, not only for a lucky instant).
With the shipped margins the lookups find the movements pending, then settled, and every payout
is POSTED. The negative control sets both margins to 0: the old rule takes the skewed
`complete_through` past the deadline as proof of absence while the movement is still invisible,
and a payout ends FAILED although its money moved.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from common.migrate import migrate
from invariants.checker import check_invariants, lock_server_grant_source
from railproxy import ProxySettings
from reconcile.reconciler import stub_movement_source
from tests.credentials import headers, token
from tests.workflows.rail_evidence import (
    nothing_moved_but_rail_settled,
    payout_states,
    rail_movements,
)
from tests.workflows.system import (
    System,
    create_payout,
    fund,
    in_process_workers,
    running_system,
    wait_for,
)
from workflows.payout import PayoutWorkflow

SUBMIT_DEADLINE_S = 2.0
INPUT: dict[str, Any] = {
    "acquire_wait_s": 2.0,
    "base_backoff_s": 0.2,
    "max_backoff_s": 1.0,
    "lookup_interval_s": 0.3,  # early and frequent lookups
    "submit_deadline_s": SUBMIT_DEADLINE_S,
    "holder_pickup_s": 3.0,
    "holder_heartbeat_timeout_s": 3.0,
}
SLOW_RAIL = {
    "latency_mode": "fixed",
    "latency_fixed_ms": int((SUBMIT_DEADLINE_S + 7) * 1000),
    "visibility_delay_s": 7.0,
    "clock_skew_s": 7.0,  # within the shipped 30 s skew margin
    "ambiguity_rate": 0.0,
    "rules": [],
}
PAYOUTS = 3


def _margins(ingest_s: float, skew_s: float) -> dict[str, str]:
    return {
        "RAILPROXY_ABSENCE_INGEST_BOUND_S": str(ingest_s),
        "RAILPROXY_ABSENCE_CLOCK_SKEW_MARGIN_S": str(skew_s),
    }


SHIPPED = _margins(
    ProxySettings.model_fields["absence_ingest_bound_s"].default,
    ProxySettings.model_fields["absence_clock_skew_margin_s"].default,
)
ZERO = _margins(0.0, 0.0)


@pytest.fixture(params=["shipped", "zero"])
def slow_system(
    request: pytest.FixtureRequest, database_url: str, run_dir: Path
) -> Iterator[tuple[str, System]]:
    asyncio.run(migrate(database_url))
    margins = SHIPPED if request.param == "shipped" else ZERO
    log_dir = run_dir / f"slow-{request.param}-{uuid.uuid4().hex[:6]}"
    with running_system(database_url, log_dir, env={"proxy": margins}) as sys_:
        sys_.stub_set(**SLOW_RAIL)
        yield request.param, sys_


async def _log_covers_now(stub_url: str) -> None:
    """Wait until the rail's stated records (on its skewed clock) begin before our now: else no
    rule, however unsafe, could call anything absent and the control would prove nothing."""

    async def covers() -> bool:
        async with httpx.AsyncClient(
            base_url=stub_url, timeout=5, headers=headers("railproxy")
        ) as http:
            data = (await http.get("/lookup", params={"client_reference": "age"})).json()
        since = datetime.fromisoformat(data["complete_from"])
        return since < datetime.now(UTC) - timedelta(seconds=0.5)

    await wait_for(covers, timeout_s=30)


async def _run_payouts(
    temporal_env: WorkflowEnvironment, system: System
) -> tuple[dict[str, m.PayoutStatus], dict[str, str], list[dict[str, Any]]]:
    """Start PAYOUTS payouts on the slow rail, wait for their results and for the rail to finish
    every movement; returns results by payout, states by reference and the rail's movements."""
    await _log_covers_now(system.stub_url)
    queue = f"payouts-{uuid.uuid4()}"
    payout_ids = [f"slow-{uuid.uuid4().hex[:10]}" for _ in range(PAYOUTS)]
    async with in_process_workers(temporal_env.client, system, queue, count=1):
        handles = []
        for payout_id in payout_ids:
            account_id = f"acct-{payout_id}"
            await fund(system.database_url, account_id, 10_000)
            await create_payout(system.database_url, payout_id, account_id, 1_000)
            inp = m.PayoutInput(payout_id=payout_id, account_id=account_id, **INPUT)
            handles.append(
                await temporal_env.client.start_workflow(
                    PayoutWorkflow.run, inp, id=f"payout-{payout_id}", task_queue=queue
                )
            )
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)

    async def rail_done() -> bool:
        movements = await rail_movements(system.stub_url)
        return len(movements) >= PAYOUTS and all(mv["status"] != "pending" for mv in movements)

    await wait_for(rail_done, timeout_s=60)
    states = await payout_states(system.database_url, payout_ids)
    return (
        dict(zip(payout_ids, results, strict=True)),
        states,
        await rail_movements(system.stub_url),
    )


async def test_slow_rail_never_fails_a_payout_it_paid(
    temporal_env: WorkflowEnvironment, slow_system: tuple[str, System]
) -> None:
    """Shipped margins: every forward times out UNKNOWN, lookups find the movement pending then
    settled, and each payout is POSTED once. Zero margins (negative control): at least one payout
    ends FAILED while the rail holds its settled movement -- the failure the margins prevent."""
    margins, system = slow_system
    results, states, movements = await _run_payouts(temporal_env, system)
    lost = nothing_moved_but_rail_settled(states, movements)
    assert len(movements) == PAYOUTS  # each instruction reached the rail once, and settled
    assert {mv["status"] for mv in movements} == {"settled"}
    assert all(r.attempt is not None and r.attempt.outcome == "UNKNOWN" for r in results.values())
    flagged = await _inv09_flagged(system, set(results))
    if margins == "shipped":
        assert lost == []
        assert {r.state for r in results.values()} == {"POSTED"}
        assert flagged == set()
    else:
        assert lost, f"the zero-margin control should lose money: {states}"
        assert all(states[ref] == "FAILED" for ref in lost)
        # The invariant checker finds the same finance break by itself (INV-09).
        failed = {pid for pid, r in results.items() if r.state == "FAILED"}
        assert flagged == failed and failed


async def _inv09_flagged(system: System, payout_ids: set[str]) -> set[str]:
    """Which of these payouts the real invariant checker reports under INV-09 (the database is
    shared with other tests, so only this test's payouts are looked at)."""
    conn = await asyncpg.connect(system.database_url)
    try:
        report = await check_invariants(
            conn,
            stub_movement_source(system.stub_url, token=token("invariants")),
            lock_server_grant_source(system.lock_url, token=token("invariants")),
            sample_size=10_000,
        )
    finally:
        await conn.close()
    inv09 = next(r for r in report.results if r.invariant == "INV-09")
    return {pid for pid in payout_ids if any(line.startswith(f"{pid} ") for line in inv09.sample)}


def test_unit_nothing_moved_but_rail_settled_names_only_paid_dead_payouts() -> None:
    """The helper flags FAILED/ABANDONED payouts with a settled movement, nothing else."""
    states: Mapping[str, str] = {"a": "FAILED", "b": "ABANDONED", "c": "POSTED", "d": "FAILED"}
    movements = [
        {"client_reference": "a", "status": "settled"},
        {"client_reference": "b", "status": "settled"},
        {"client_reference": "c", "status": "settled"},
        {"client_reference": "d", "status": "declined"},
    ]
    assert nothing_moved_but_rail_settled(states, movements) == ["a", "b"]
    assert nothing_moved_but_rail_settled(states, movements, ("FAILED",)) == ["a"]
