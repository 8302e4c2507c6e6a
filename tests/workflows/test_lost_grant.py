"""A grant whose acquire result never reached its workflow is given back at once (issue 16),
with the real components: Temporal dev server, PostgreSQL, the lock server and the real
activities in an in-process worker (its own lock session, as worker/process.py runs it).

The loss is made through the real mechanism: the payout's acquire waits at the lock server for
the account's key, which the test holds; its workflow is terminated meanwhile (like an attempt
Temporal timed out while it was unreachable, nobody will receive the answer); then the test
lets the key go, so the lock server grants it to the waiting acquire. The worker hands the
grant over itself, Temporal answers NOT_FOUND, and the worker releases the grant. Before this,
the worker's session (kept alive by its heartbeat) held that grant until its idle sweeper ran,
which no in-process worker here runs at all: the next acquire of the account could never
succeed. Asserted from the lock server's grant history and tokens, not from the clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from common.lockkey import lock_key
from common.migrate import migrate
from lockservice.sdk import LockClient
from tests.credentials import token
from tests.workflows.system import (
    System,
    create_payout,
    fund,
    in_process_workers,
    key_grants,
    lock_info,
    running_system,
    wait_for,
)
from workflows.payout import PayoutWorkflow


@pytest.fixture(scope="module")
def system(database_url: str, run_dir: Path) -> Iterator[System]:
    asyncio.run(migrate(database_url))
    with running_system(database_url, run_dir / f"lost-{uuid.uuid4().hex[:6]}") as sys_:
        yield sys_


async def test_a_grant_its_workflow_never_received_is_released_and_the_next_acquire_succeeds(
    temporal_env: WorkflowEnvironment, system: System
) -> None:
    payout_id = f"po-{uuid.uuid4().hex[:10]}"
    account_id = f"acct-{payout_id[3:]}"
    key = lock_key(account_id)
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 100)
    queue = f"payouts-{uuid.uuid4()}"
    async with (
        LockClient(system.lock_url, ttl_s=3.0, heartbeat_s=0.75, token=token("worker")) as other,
        in_process_workers(temporal_env.client, system, queue, count=1) as [worker],
    ):
        blocker = await other.acquire(key)
        # A long heartbeat timeout: the SDK sends the acquire's heartbeats at most every 0.8 of
        # it, so the worker does not learn of the termination (a heartbeat's answer) before
        # the grant arrives, and the activity does complete, with an answer nobody receives.
        inp = m.PayoutInput(
            payout_id=payout_id,
            account_id=account_id,
            acquire_wait_s=60.0,
            holder_heartbeat_timeout_s=60.0,
        )
        handle = await temporal_env.client.start_workflow(
            PayoutWorkflow.run, inp, id=f"payout-{payout_id}", task_queue=queue
        )

        async def acquire_waiting() -> bool:
            waiting: bool = lock_info(system, key)["waiters"] == 1
            return waiting

        await wait_for(acquire_waiting)
        await handle.terminate("drill: the acquire's answer will reach nobody")
        await other.release(blocker)

        async def orphan_granted_and_settled() -> bool:
            tokens = [g["token"] for g in key_grants(system, key)]
            return len(tokens) == 2 and worker.acts.handovers == 0

        await wait_for(orphan_granted_and_settled)
        # The next acquire of the account, by another session: granted, not left waiting for a
        # grant that this worker's live session would otherwise hold for as long as it lives.
        nxt = await other.acquire(key, wait_s=10.0)
        sessions = (other.session_id, worker.locks.session_id)
        leases_left = len(worker.acts.grants)
        await other.release(nxt)

    blocked, orphan, after = key_grants(system, key)
    # The orphan was the worker's session's, and the worker released it: it did not expire
    # with that session (alive throughout), nor wait for a sweeper; the worker keeps nothing.
    assert (blocked["session_id"], orphan["session_id"], after["session_id"]) == (
        sessions[0],
        sessions[1],
        sessions[0],
    )
    assert orphan["end_reason"] == "released"
    assert leases_left == 0
    assert int(str(after["token"])) > int(str(orphan["token"])) > int(str(blocked["token"]))
