"""What PayoutWorkflow's integration tests against the real components share
(test_payout_integration_*.py, and the operator and Temporal-restart tests): the rail stub's
RULES, short timings (FAST), a payout id and account, a started payout, the account's balance
and the ledger's breaks, and `record`, which writes a run's replay history under
tests/workflows/histories/ when RECORD_HISTORIES=1 is set.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import asyncpg
from temporalio.client import Client, WorkflowHandle

from activities import models as m
from ledger.queries import ledger_discrepancies
from workflows.payout import PayoutWorkflow

HISTORIES = Path(__file__).parent / "histories"
FAST = {
    "acquire_wait_s": 2.0,
    "base_backoff_s": 0.2,
    "max_backoff_s": 1.0,
    "lookup_interval_s": 0.3,
    "submit_deadline_s": 2.0,
    "holder_pickup_s": 3.0,
    "holder_heartbeat_timeout_s": 3.0,
}
RULES = [
    {"reference_prefix": "dcl-", "action": "decline"},
    {"reference_prefix": "amb-", "action": "ambiguous"},
    {"reference_prefix": "tb-", "action": "timeout_before"},
    {"reference_prefix": "slow-", "action": "settle", "latency_ms": 2500},
]


def ids(prefix: str = "po-") -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:10]
    return f"{prefix}{suffix}", f"acct-{suffix}"


async def start(
    client: Client, queue: str, payout_id: str, account_id: str, **kw: float | bool
) -> WorkflowHandle[PayoutWorkflow, m.PayoutStatus]:
    inp = m.PayoutInput(payout_id=payout_id, account_id=account_id, **{**FAST, **kw})  # type: ignore[arg-type]
    return await client.start_workflow(
        PayoutWorkflow.run, inp, id=f"payout-{payout_id}", task_queue=queue
    )


async def record(handle: WorkflowHandle[PayoutWorkflow, m.PayoutStatus], name: str) -> None:
    if os.environ.get("RECORD_HISTORIES"):
        HISTORIES.mkdir(exist_ok=True)
        history = await handle.fetch_history()
        (HISTORIES / f"{name}.json").write_text(history.to_json())


async def balance_and_breaks(database_url: str, account_id: str) -> tuple[int, int]:
    conn = await asyncpg.connect(database_url)
    try:
        balance = await conn.fetchval(
            "SELECT balance FROM paydb.balances WHERE account_id = $1", account_id
        )
        breaks = await ledger_discrepancies(conn)
        return int(balance), len(breaks)
    finally:
        await conn.close()
