"""Putting payouts into the system: funded accounts, payout rows and one workflow per payout.

Owns: the entry points that the `payouts seed|payout` commands, the lab and tests share
(`seed_accounts`, `create_payouts`, `start_workflows`, `stranded_payouts`, `connect_temporal`).
Must never: move money itself (the workflow does, fenced), or start a workflow beside a running
one of the same payout (`activities.redrive.start_payout`: the workflow id `payout-{id}` with
ALLOW_DUPLICATE_FAILED_ONLY).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from payouts.batch import PayoutSpec
from payouts.errors import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CommandError,
    temporal_unreachable,
    workflow_error,
)


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
    """A Temporal client (traced when this process set up tracing: common.tracing), or
    `CommandError(EXIT_UNAVAILABLE)` naming the address."""
    from temporalio.client import Client

    from common import tracing
    from common.temporal_tls import TemporalTLSError, temporal_tls

    try:
        tls = temporal_tls()  # the Temporal CLI's TEMPORAL_TLS_* variables
    except TemporalTLSError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    try:
        return await Client.connect(address, interceptors=tracing.temporal_interceptors(), tls=tls)
    except RuntimeError as exc:  # the SDK reports a failed connect as RuntimeError
        detail = str(exc).splitlines()[0]
        if tls is not False:  # never a silent fall-back to plain gRPC
            detail += "; over TLS, as TEMPORAL_TLS* asked (the dev server serves none)"
        raise temporal_unreachable(address, detail) from None


async def find_payout(client: Any, given: str) -> str:
    """The payout id `given` names: a payout id, or its workflow id `payout-<id>` as `payout
    list` and the Temporal UI print it. A payout whose own id starts with `payout-` wins (its
    workflow is `payout-payout-...`). No workflow for either: `workflow_error` (not found)."""
    from temporalio.service import RPCError, RPCStatusCode

    candidates = [given]
    if given.startswith("payout-") and len(given) > len("payout-"):
        candidates.append(given.removeprefix("payout-"))
    for payout_id in candidates:
        try:
            await client.get_workflow_handle(f"payout-{payout_id}").describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise workflow_error(exc, given, client.service_client.config.target_host) from None
            continue
        return payout_id
    tried = " or ".join(f"payout-{c}" for c in candidates)
    raise CommandError(f"unknown payout {given} (no workflow {tried})", EXIT_NOT_FOUND)


async def start_workflows(
    address: str, queue: str, specs: list[PayoutSpec], client: Any = None, **input_overrides: Any
) -> int:
    """Start the workflow of each payout; returns how many were started now.

    Idempotent, keyed by the workflow id `payout-{id}` (`activities.redrive.start_payout`): a
    payout whose workflow is running or has completed is skipped, so re-running after a partial
    failure starts exactly the missing ones and never a second workflow beside a running one.
    """
    from temporalio.common import SearchAttributePair

    from activities.models import PayoutInput
    from activities.redrive import start_payout
    from workflows.search_attributes import PAYOUT_ACCOUNT, PAYOUT_ESCALATED, PAYOUT_STATE

    client = client or await connect_temporal(address)
    sem = asyncio.Semaphore(32)
    started = 0

    async def one(s: PayoutSpec) -> None:
        nonlocal started
        inp = PayoutInput(
            payout_id=s.payout_id,
            account_id=s.account_id,
            correlation_id=s.payout_id,
            amount=s.amount,
            **input_overrides,
        )
        # Findable by state from the start, before its first workflow task runs.
        attributes: list[SearchAttributePair[Any]] = [
            SearchAttributePair(PAYOUT_STATE, s.state),
            SearchAttributePair(PAYOUT_ACCOUNT, s.account_id),
            SearchAttributePair(PAYOUT_ESCALATED, False),
        ]
        async with sem:
            if await start_payout(client, queue, inp, attributes):
                started += 1

    await asyncio.gather(*(one(s) for s in specs))
    return started


async def stranded_payouts(
    db_url: str, client: Any, payout_ids: list[str] | None = None
) -> list[PayoutSpec]:
    """Every non-terminal payout (or of `payout_ids`) whose workflow is not running: never
    started (a `payout create` that failed half-way), or ended without completing (terminated,
    ...): nothing drives them."""
    from activities.redrive import find_stranded

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    try:
        stranded = await find_stranded(pool, client, limit=100_000, payout_ids=payout_ids)
    finally:
        await pool.close()
    return [PayoutSpec(s.payout_id, s.account_id, s.amount, s.state) for s in stranded]
