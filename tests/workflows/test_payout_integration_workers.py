"""PayoutWorkflow end to end against the real components (Temporal dev server, PostgreSQL, the
lock server, the rail proxy and the rail stub, with the real activities), the rail stub's
movement log checked every time: several workers and accounts pay each payout once, and a
worker killed mid-submit is recovered by state without a second submission.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from tests.credentials import headers, token_file
from tests.grants import public_keys
from tests.workflows.integration import RULES, balance_and_breaks, ids, record, start
from tests.workflows.system import (
    System,
    create_payout,
    fund,
    in_process_workers,
    lock_token,
    spawn,
    stop,
    wait_for,
)

__all__ = ["RULES"]  # the rail stub's, for the `system` fixture (tests/workflows/conftest.py)
WORKERS = 2  # the `workers` fixture's (tests/workflows/conftest.py)


async def test_two_workers_one_account_each_payout_once(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-02: two workers, one account, many payouts at once: one submission each, all posted,
    the balance debited by exactly the sum."""
    _, account_id = ids()
    await fund(system.database_url, account_id, 100_000)
    payout_ids = [f"po-{uuid.uuid4().hex[:10]}" for _ in range(8)]
    for pid in payout_ids:
        await create_payout(system.database_url, pid, account_id, 1_000)
    handles = [await start(temporal_env.client, workers, pid, account_id) for pid in payout_ids]
    results = await asyncio.gather(*(h.result() for h in handles))
    assert {r.state for r in results} == {"POSTED"}
    assert [len(system.movements(pid)) for pid in payout_ids] == [1] * len(payout_ids)
    assert await balance_and_breaks(system.database_url, account_id) == (92_000, 0)


@pytest.mark.parametrize("two_task", [True, False], ids=["two_task", "three_task"])
async def test_worker_killed_mid_submit_recovers_by_state(
    temporal_env: WorkflowEnvironment, system: System, run_dir: Path, two_task: bool
) -> None:
    """UC-04: a worker process is SIGKILLed while its submit is in flight; another worker
    re-acquires with a higher token, reads the proxy's attempt record and completes the
    payout without submitting again; in both shapes of the A/B switch."""
    queue = f"payouts-{uuid.uuid4()}"
    payout_id, account_id = ids("slow-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 1_200)
    env = {
        "WORKER_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "WORKER_DATABASE_URL": system.database_url,
        "WORKER_LOCK_URL": system.lock_url,
        "WORKER_RAILPROXY_URL": system.proxy_url,
        "WORKER_GRANT_PUBLIC_KEYS": public_keys(),
        "WORKER_TASK_QUEUE": queue,
        "WORKER_ID": "doomed",
        "WORKER_TOKEN_FILE": token_file("worker"),
        "WORKER_LOCK_TTL_S": "3",
        "WORKER_LOCK_HEARTBEAT_S": "0.5",
    }
    doomed = spawn(["worker_main.py"], env, system.log_dir / "doomed-worker.log")
    try:
        handle = await start(
            temporal_env.client,
            queue,
            payout_id,
            account_id,
            submit_deadline_s=5.0,
            two_task=two_task,
        )

        async def in_flight() -> bool:
            # The proxy recorded the attempt and is waiting for the (slow) rail: no outcome yet.
            async with httpx.AsyncClient(base_url=system.proxy_url, headers=headers()) as http:
                attempts = (await http.get(f"/v1/payouts/{payout_id}/attempts")).json()
            return any(a["outcome"] is None for a in attempts["attempts"])

        await wait_for(in_flight, timeout_s=60)
        first_token = lock_token(system, f"payout:{account_id}") or 0
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        async with in_process_workers(temporal_env.client, system, queue, count=1):
            result = await handle.result()
        # Killed inside the merged step, after the submit was sent: recovered by the proxy's
        # attempt record under the next grant.
        shape = "two_task" if two_task else "three_task"
        await record(handle, f"{shape}_worker_killed_recovered")
    finally:
        if doomed.poll() is None:
            stop(doomed)
    assert doomed.returncode == -signal.SIGKILL
    assert result.state == "POSTED"
    assert result.token > first_token
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (8_800, 0)
    # The killed attempt was the merged step; it was not retried, and the next grant (another
    # merged step, which found the payout in flight) did not submit again: it recovered from
    # the attempt record, then posted.
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled.count(m.SUBMIT_TO_RAIL) == 0
    assert m.RECOVER_FROM_ATTEMPT in scheduled
    merged = m.ACQUIRE_AND_EXECUTE if two_task else m.EXECUTE_PAYOUT
    assert scheduled.count(merged) == 2


def test_worker_main_entry_point_is_importable() -> None:
    """`python worker_main.py --help`-free smoke: the module imports and builds its settings."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import worker_main; from worker.settings import WorkerSettings; print(WorkerSettings().task_queue)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "WORKER_TASK_QUEUE": "q-smoke"},
    )
    assert out.stdout.strip() == "q-smoke"


async def test_one_worker_holds_many_accounts_at_once(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """Tokens are per key: a worker holding token 1 of several accounts at the same time keeps
    each grant apart, and every payout is paid once."""
    accounts = [ids()[1] for _ in range(6)]
    for a in accounts:
        await fund(system.database_url, a, 50_000)
    payouts = []
    for a in accounts:
        for _ in range(2):
            pid = f"po-{uuid.uuid4().hex[:10]}"
            await create_payout(system.database_url, pid, a, 1_000)
            payouts.append((pid, a))
    handles = [await start(temporal_env.client, workers, pid, a) for pid, a in payouts]
    results = await asyncio.gather(*(h.result() for h in handles))
    assert {r.state for r in results} == {"POSTED"}
    assert [len(system.movements(pid)) for pid, _ in payouts] == [1] * len(payouts)
    for a in accounts:
        assert await balance_and_breaks(system.database_url, a) == (48_000, 0)
