"""PayoutWorkflow end to end against the real components (Temporal dev server, PostgreSQL, the
lock server, the rail proxy and the rail stub, with the real activities), the rail stub's
movement log checked every time: an operator's abandon and revoke are carried out, and
malformed or unasserted signals are rejected and audited while the payout goes on.
"""

from __future__ import annotations

import asyncio
import subprocess

import asyncpg
import httpx
from temporalio.testing import WorkflowEnvironment

from lockservice.sdk import LockClient
from stack.embedded.temporal import temporal_binary
from tests.credentials import OPERATOR, headers, token
from tests.workflows.integration import RULES, balance_and_breaks, ids, record, start
from tests.workflows.system import (
    System,
    audit_rows,
    create_payout,
    fund,
    lock_token,
    signed_command,
    wait_for,
)
from workflows.payout import PayoutWorkflow

__all__ = ["RULES"]  # the rail stub's, for the `system` fixture (tests/workflows/conftest.py)
WORKERS = 2  # the `workers` fixture's (tests/workflows/conftest.py)


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
