"""Putting payouts into the system: funded accounts, payout rows and one workflow per payout.

Owns: the entry points that the `payouts seed|payout` commands, the lab and tests share
(`seed_accounts`, `create_payouts`, `start_workflows`, `pending_payouts`, `connect_temporal`).
Must never: move money itself (the workflow does, fenced), or start a second workflow for a
payout (the workflow id `payout-{id}` with REJECT_DUPLICATE prevents it).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import asyncpg

from payouts.batch import PayoutSpec
from payouts.errors import EXIT_UNAVAILABLE, CommandError


async def seed_accounts(db_url: str, count: int, balance: int, prefix: str) -> list[str]:
    from ledger import PayoutStore, WorkContext
    from ledger.errors import DuplicateAccount

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    created = []
    try:
        store = PayoutStore(pool)
        for i in range(count):
            account_id = f"{prefix}{i:05d}"
            ctx = WorkContext(correlation_id=f"seed:{account_id}", actor="payouts-seed")
            with contextlib.suppress(DuplicateAccount):
                # Seeding is re-runnable: an existing account is topped up.
                await store.create_account(account_id, ctx)
            await store.fund_account(account_id, balance, ctx)
            created.append(account_id)
    finally:
        await pool.close()
    return created


async def create_payouts(db_url: str, specs: list[PayoutSpec]) -> None:
    """All or nothing: unknown accounts and duplicate ids are found before any write."""
    from ledger import PayoutStore, WorkContext

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            known = {
                r["account_id"]
                for r in await conn.fetch(
                    "SELECT account_id FROM paydb.accounts WHERE account_id = ANY($1::text[])",
                    list({s.account_id for s in specs}),
                )
            }
            existing = {
                r["payout_id"]
                for r in await conn.fetch(
                    "SELECT payout_id FROM paydb.payouts WHERE payout_id = ANY($1::text[])",
                    [s.payout_id for s in specs],
                )
            }
        missing = sorted({s.account_id for s in specs} - known)
        if missing:
            raise CommandError(f"unknown account(s): {', '.join(missing[:5])}; nothing created")
        if existing:
            raise CommandError(
                f"payout(s) already exist: {', '.join(sorted(existing)[:5])}; nothing created"
                " (a PENDING payout without a workflow: `payouts payout start-pending`)"
            )
        store = PayoutStore(pool)
        for s in specs:
            ctx = WorkContext(correlation_id=s.payout_id, actor="payouts-cli")
            await store.create_payout(s.payout_id, s.account_id, s.amount, ctx)
    finally:
        await pool.close()


async def connect_temporal(address: str) -> Any:
    """A Temporal client, or `CommandError(EXIT_UNAVAILABLE)` naming the address."""
    from temporalio.client import Client

    try:
        return await Client.connect(address)
    except RuntimeError as exc:  # the SDK reports a failed connect as RuntimeError
        raise CommandError(
            f"Temporal at {address} is unreachable ({str(exc).splitlines()[0][:120]})",
            EXIT_UNAVAILABLE,
        ) from None


def workflow_task_timeout(holder_heartbeat_timeout_s: float) -> timedelta:
    """The payout workflow's task timeout: half the holder heartbeat timeout, within 1..10 s.

    Why (issue 16, takeover): after a frozen holder's step times out, its next workflow task is
    taken by the frozen worker's open long-polls twice, on its sticky queue and then on the
    shared queue, and each time waits out this timeout before another worker may take it. So a
    takeover costs the heartbeat timeout plus twice this: half of it keeps that at about two
    heartbeat timeouts (at a 3 s holder heartbeat timeout, 1.5 s instead of 3 s). It bounds a
    task's processing only, never its wait in the queue, and a healthy worker processes one in
    milliseconds (94 ms per task in a CPU-bound burst): at the default 10 s heartbeat timeout it
    is 5 s (Temporal's own default is 10 s); the 1 s floor keeps a tiny heartbeat timeout from
    timing out healthy tasks.
    """
    return timedelta(seconds=max(1.0, min(10.0, holder_heartbeat_timeout_s / 2)))


async def start_workflows(
    address: str, queue: str, specs: list[PayoutSpec], client: Any = None, **input_overrides: Any
) -> int:
    """Start the workflow of each payout; returns how many were started now.

    Idempotent, keyed by the workflow id `payout-{id}`: a payout whose workflow already exists
    (running or finished) is skipped, so re-running after a partial failure starts exactly the
    missing ones and never a second workflow for a payout.
    """
    from temporalio.common import (
        SearchAttributePair,
        TypedSearchAttributes,
        WorkflowIDReusePolicy,
    )
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from activities.models import PayoutInput
    from workflows.payout import PayoutWorkflow
    from workflows.search_attributes import PAYOUT_ACCOUNT, PAYOUT_ESCALATED, PAYOUT_STATE

    client = client or await connect_temporal(address)
    sem = asyncio.Semaphore(32)
    started = 0

    async def one(s: PayoutSpec) -> None:
        nonlocal started
        async with sem:
            with contextlib.suppress(WorkflowAlreadyStartedError):  # it exists: keep it
                inp = PayoutInput(
                    payout_id=s.payout_id,
                    account_id=s.account_id,
                    correlation_id=s.payout_id,
                    **input_overrides,
                )
                await client.start_workflow(
                    PayoutWorkflow.run,
                    inp,
                    id=f"payout-{s.payout_id}",
                    task_queue=queue,
                    task_timeout=workflow_task_timeout(inp.holder_heartbeat_timeout_s),
                    # Findable by state from the start, before its first workflow task runs.
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(PAYOUT_STATE, "PENDING"),
                            SearchAttributePair(PAYOUT_ACCOUNT, s.account_id),
                            SearchAttributePair(PAYOUT_ESCALATED, False),
                        ]
                    ),
                    # One workflow per payout, ever: a second start of the same payout is refused.
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                )
                started += 1

    await asyncio.gather(*(one(s) for s in specs))
    return started


async def pending_payouts(db_url: str) -> list[PayoutSpec]:
    """Every PENDING payout: the ones that may still lack a workflow."""
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT payout_id, account_id, amount FROM paydb.payouts"
            " WHERE state = 'PENDING' ORDER BY created_at"
        )
    finally:
        await conn.close()
    return [PayoutSpec(r["payout_id"], r["account_id"], int(r["amount"])) for r in rows]
