"""PayoutWorkflow end to end against the real components: Temporal dev server, PostgreSQL, the
lock server, the rail proxy and the rail stub, with the real activities.

The rail stub's movement log is the evidence of what reached the rail; every test checks it.
Set RECORD_HISTORIES=1 to (re)write the replay histories under tests/workflows/histories/.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from ledger.queries import ledger_discrepancies
from lockservice.sdk import LockClient
from stack.embedded.temporal import temporal_binary
from tests.credentials import OPERATOR, headers, token, token_file
from tests.grants import public_keys
from tests.workflows.system import (
    System,
    audit_rows,
    create_payout,
    fund,
    in_process_workers,
    lock_token,
    signed_command,
    spawn,
    stop,
    wait_for,
)
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
WORKERS = 2  # the `workers` fixture's (tests/workflows/conftest.py)
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


@pytest.mark.parametrize("two_task", [True, False], ids=["two_task", "three_task"])
async def test_happy_path_pays_once_and_posts(
    temporal_env: WorkflowEnvironment, system: System, workers: str, two_task: bool
) -> None:
    """UC-01: one rail movement, POSTED, the account debited once, the ledger balanced; in both
    shapes of the A/B switch (`PayoutInput.two_task`)."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 2_500)
    handle = await start(temporal_env.client, workers, payout_id, account_id, two_task=two_task)
    result = await handle.result()
    await record(handle, "two_task_happy_path" if two_task else "three_task_happy_path")
    assert result.state == "POSTED"
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (7_500, 0)
    # Two-task: ONE activity acquired, then did claim, submit, post and the release: 2 workflow
    # tasks. Three-task: the acquire, then execute_payout on the holder's queue: 3 tasks. What
    # the merged step did is in its result for operators.
    history = await handle.fetch_history()
    done = [
        e.activity_task_completed_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    ]
    assert len(done) == (1 if two_task else 2)  # no separate step or release
    executed = json.loads(done[-1].result.payloads[0].data)
    executed = executed["view"] if two_task else executed
    assert executed["steps"] == ["claim", "submit", "post", "release"] and executed["released"]
    tasks = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    completed = [e.event_id for e in history.events if e.event_type == tasks]
    assert len(completed) == (2 if two_task else 3)
    # Search attributes are upserted by the first and the last task only (one visibility write
    # each; the middle task upserts nothing). Started without search attributes, the first task
    # upserted all three; the last only the state.
    upserts = [
        e.upsert_workflow_search_attributes_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert {u.workflow_task_completed_event_id for u in upserts} == {completed[0], completed[-1]}
    last = [u for u in upserts if u.workflow_task_completed_event_id == completed[-1]]
    assert [set(u.search_attributes.indexed_fields) for u in last] == [{"PayoutState"}]
    # The grant was released by the activity: the account's lock is free at once.
    assert lock_token(system, f"payout:{account_id}") is None
    # Findable by state with the real `temporal` CLI (the search attributes it upserted).
    address = temporal_env.client.service_client.config.target_host
    query = f'PayoutState="POSTED" AND PayoutAccountId="{account_id}"'

    async def listed() -> bool:
        found = await asyncio.to_thread(temporal_list, address, query)
        return [w["execution"]["workflowId"] for w in found] == [f"payout-{payout_id}"]

    await wait_for(listed, timeout_s=30)


def temporal_list(address: str, query: str) -> list[dict[str, Any]]:
    """`temporal workflow list --query ... -o json`: the real CLI, as an operator runs it."""
    argv = [temporal_binary(), "workflow", "list", "--address", address, "--query", query]
    done = subprocess.run(
        [*argv, "--output", "json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return rows


async def test_decline_fails_without_ledger(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-01 (c): a business decline ends FAILED, the balance untouched."""
    payout_id, account_id = ids("dcl-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 1_000)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "decline")
    assert result.state == "FAILED"
    assert await balance_and_breaks(system.database_url, account_id) == (10_000, 0)
    assert len(system.movements(payout_id)) == 1  # the rail saw it once and declined it


async def test_insufficient_funds_never_reaches_the_rail(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-01 (b): insufficient funds -> FAILED at claim, no rail movement."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 100)
    await create_payout(system.database_url, payout_id, account_id, 1_000)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "insufficient_funds")
    assert result.state == "FAILED"
    assert system.movements(payout_id) == []


async def test_ambiguous_is_resolved_by_lookup(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-05: the rail recorded it but answered with an error; a lookup finds it settled, it is
    posted, and it was never submitted again."""
    payout_id, account_id = ids("amb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 3_000)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "ambiguous_resolved")
    assert result.state == "POSTED"
    assert result.attempt is not None and result.attempt.outcome == "UNKNOWN"
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (7_000, 0)


async def test_timeout_before_handoff_is_resolved_absent(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """A stall before the rail recorded anything is UNKNOWN to the proxy; the lookup, complete
    past the attempt's deadline, proves it absent, and the payout FAILS without a resubmit."""
    payout_id, account_id = ids("tb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 500)
    handle = await start(temporal_env.client, workers, payout_id, account_id)
    result = await handle.result()
    await record(handle, "timeout_before_absent")
    assert result.state == "FAILED"
    assert system.movements(payout_id) == []
    assert await balance_and_breaks(system.database_url, account_id) == (10_000, 0)


async def test_ambiguous_is_abandoned_by_an_operator(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-05 step 6: lookups stay inconclusive past the SLA; the escalation happens and the
    operator's abandon (with identity and reason) moves it to ABANDONED."""
    payout_id, account_id = ids("amb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 700)
    system.stub_set(visibility_delay_s=3600)  # the rail's lookup lags far behind
    try:
        handle = await start(
            temporal_env.client, workers, payout_id, account_id, resolution_sla_s=1.0
        )

        async def escalated() -> bool:
            return (await handle.query(PayoutWorkflow.status)).escalated

        await wait_for(escalated)
        await handle.signal(
            "abandon",
            signed_command(system, "abandon", payout_id, "rail ticket 42: no record"),
        )
        result = await handle.result()
    finally:
        system.stub_set(visibility_delay_s=0)
    await record(handle, "ambiguous_abandoned")
    assert result.state == "ABANDONED"
    conn = await asyncpg.connect(system.database_url)
    try:
        actor = await conn.fetchval(
            "SELECT actor FROM paydb.audit_log WHERE payout_id = $1 AND to_state = 'ABANDONED'",
            payout_id,
        )
    finally:
        await conn.close()
    assert actor == OPERATOR  # the identity the lock server asserted, authenticated by token
    assert len(system.movements(payout_id)) == 1


async def test_revoke_signal_fences_the_holder_and_the_payout_completes(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """UC-06: an operator revoke through the workflow ends the grant; the workflow re-acquires
    with a higher token and finishes; the rail saw one movement."""
    payout_id, account_id = ids("slow-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 900)
    handle = await start(temporal_env.client, workers, payout_id, account_id, submit_deadline_s=5.0)

    async def submitting() -> bool:
        # The proxy recorded the attempt and waits for the (slow) rail, inside the merged step.
        async with httpx.AsyncClient(base_url=system.proxy_url, headers=headers()) as http:
            attempts = (await http.get(f"/v1/payouts/{payout_id}/attempts")).json()
        return any(a["outcome"] is None for a in attempts["attempts"])

    await wait_for(submitting)
    # The token the holder holds, from the lock server: in the two-task shape the workflow
    # learns it only when the merged step returns, which may be after the revoke.
    first_token = lock_token(system, f"payout:{account_id}")
    assert first_token is not None and first_token > 0
    await handle.signal(
        "revoke", signed_command(system, "revoke", payout_id, "stuck holder drill", account_id)
    )
    result = await handle.result()
    await record(handle, "revoke")
    assert result.state == "POSTED"
    assert result.token > first_token
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (9_100, 0)


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


MALFORMED_SIGNALS = [
    '"just a string"',  # a bare string
    '{"operator": 7, "reason": ["x"]}',  # wrong types
    '{"operator": "ana", "reason": "drill", "reson": "typo"}',  # an extra field
    "null",  # nothing
]


async def test_malformed_operator_signals_are_rejected_and_audited(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """Each malformed payload, sent with the real `temporal` CLI, is rejected with an audit row
    and shown in the status; so is a well-formed revoke with a free-text operator and no
    operator assertion (anyone who can reach Temporal can send it): the payment store refuses it
    when the workflow would accept it, and the holder keeps its lock. The workflow goes on and completes once it can."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 100)
    address = temporal_env.client.service_client.config.target_host
    argv = [temporal_binary(), "workflow", "signal", "--address", address]
    argv += ["--workflow-id", f"payout-{payout_id}"]
    async with LockClient(
        system.lock_url, ttl_s=15.0, heartbeat_s=3.0, token=token("worker")
    ) as locks:
        # Someone else holds the account's lock: the workflow keeps waiting, alive, in PENDING.
        blocker = await locks.acquire(f"payout:{account_id}")
        handle = await start(temporal_env.client, workers, payout_id, account_id)
        for payload in MALFORMED_SIGNALS:
            await asyncio.to_thread(
                subprocess.run,
                [*argv, "--name", "abandon", "--input", payload],
                check=True,
                capture_output=True,
                timeout=60,
            )
        unasserted = '{"operator": "mallory", "reason": "let me in"}'
        await asyncio.to_thread(
            subprocess.run,
            [*argv, "--name", "revoke", "--input", unasserted],
            check=True,
            capture_output=True,
            timeout=60,
        )

        async def all_audited() -> bool:
            abandons = await audit_rows(system.database_url, payout_id, "signal_rejected:abandon")
            revokes = await audit_rows(system.database_url, payout_id, "signal_rejected:revoke")
            return len(abandons) == len(MALFORMED_SIGNALS) and len(revokes) == 1

        await wait_for(all_audited, timeout_s=60)
        status = await handle.query(PayoutWorkflow.status)
        assert len(status.rejected_signals) == len(MALFORMED_SIGNALS) + 1
        assert status.state == "PENDING"
        # The unasserted revoke changed nothing: the blocker still holds the lock.
        assert lock_token(system, f"payout:{account_id}") == blocker.token
        assert await audit_rows(system.database_url, payout_id, "lock_revoke_requested") == []
        await locks.release(blocker)
    result = await handle.result()
    assert result.state == "POSTED"
    (revoke,) = await audit_rows(system.database_url, payout_id, "signal_rejected:revoke")
    # Refused by the payment store when the workflow accepted it (no assertion), and the typed
    # name is marked as a claim nobody verified.
    assert revoke["actor"] == "unverified:mallory" and "(missing)" in revoke["details"]
    whys = [
        r["details"]
        for r in await audit_rows(system.database_url, payout_id, "signal_rejected:abandon")
    ]
    assert any("unexpected field" in w for w in whys) and any("invalid payload" in w for w in whys)


async def test_a_submit_that_reached_nothing_is_submitted_under_the_next_grant(
    temporal_env: WorkflowEnvironment, system: System, workers: str
) -> None:
    """The rail is down (nothing reaches it): the merged step's submit is NOT_SUBMITTED and the
    payout stays CLAIMED; after a backoff the next grant reads the proxy's attempt record, which
    proves nothing was handed off, and submits once more (`submit_to_rail`): POSTED, one
    movement. Last in the module: the rail's outage also opens the proxy's circuit breaker."""
    payout_id, account_id = ids()
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 400)
    system.stub_set(outage=True)
    try:
        handle = await start(temporal_env.client, workers, payout_id, account_id)

        async def not_submitted() -> bool:
            status = await handle.query(PayoutWorkflow.status)
            return status.last_error.startswith("not submitted")

        await wait_for(not_submitted, timeout_s=60)
    finally:
        system.stub_set(outage=False)
    result = await handle.result()
    await record(handle, "not_submitted_then_submitted")
    assert result.state == "POSTED"
    assert len(system.movements(payout_id)) == 1
    assert await balance_and_breaks(system.database_url, account_id) == (9_600, 0)
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert m.SUBMIT_TO_RAIL in scheduled
