"""The payout's posting in one statement (`ledger.store.steps.write_posting`, issue 29) against a
real PostgreSQL: its ledger group, entries, balances and `ledger.posted` event are what
`ledger.journal.write_group` and `ledger.outbox.write_event` write for the same posting, and every
account's balance still equals the sum of its entries."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from ledger import Payout, PayoutState, PayoutStore, WorkContext
from ledger.journal import RAIL_CLEARING, write_group
from ledger.outbox import write_event
from ledger.queries import ledger_discrepancies
from tests.ledger.conftest import funded_account, new_id, rolled_back

S = PayoutState


async def _posting(conn: asyncpg.Connection, payout: Payout) -> dict[str, Any]:
    """What the payout's posting wrote, its group id replaced by "G" (each posting draws its
    own), and the customer's balance."""
    group = await conn.fetchrow(
        "SELECT group_id, kind, payout_id, correlation_id, token FROM paydb.ledger_groups"
        " WHERE payout_id = $1",
        payout.payout_id,
    )
    assert group is not None
    gid = str(group["group_id"])
    entries = await conn.fetch(
        "SELECT account_id, amount FROM paydb.ledger_entries WHERE group_id = $1 ORDER BY entry_id",
        group["group_id"],
    )
    event = await conn.fetchrow(
        "SELECT event_type, correlation_id, causation_id, contract_version, payload::text,"
        " traceparent, tracestate FROM paydb.outbox"
        " WHERE event_type = 'ledger.posted' AND payload->>'payout_id' = $1",
        payout.payout_id,
    )
    assert event is not None
    balance = await conn.fetchval(
        "SELECT balance FROM paydb.balances WHERE account_id = $1", payout.account_id
    )
    return {
        "group": [str(v).replace(gid, "G") for v in list(group.values())[1:]],
        "entries": [tuple(r) for r in entries],
        "event": [str(v).replace(gid, "G") for v in event.values()],
        "balance": balance,
    }


async def test_the_posting_writes_what_the_helpers_write(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    account = await funded_account(store, ctx, 1_000)
    p = await store.create_payout(new_id("po"), account, 300, ctx)
    for step in (store.claim, store.mark_submitted, store.mark_acked):
        await step(p.payout_id, 7, ctx)
    # The helpers' posting first, rolled back (a payout's group is UNIQUE, and neither table
    # lets a row be deleted).
    group_id = uuid.uuid4()
    correlation_id = f"{account}:{p.payout_id}:{group_id}"
    async with rolled_back(pool) as conn:
        await write_group(
            conn,
            group_id=group_id,
            kind="payout",
            correlation_id=correlation_id,
            entries=[(account, -300), (RAIL_CLEARING, 300)],
            payout_id=p.payout_id,
            token=7,
        )
        await write_event(
            conn,
            event_type="ledger.posted",
            ctx=ctx,
            correlation_id=correlation_id,
            payload={
                "kind": "payout",
                "group_id": str(group_id),
                "payout_id": p.payout_id,
                "account_id": account,
                "amount": 300,
                "entries": [[account, -300], [RAIL_CLEARING, 300]],
            },
        )
        by_helpers = await _posting(conn, p)
    posted = await store.post(p.payout_id, 7, ctx)
    assert isinstance(posted, Payout) and posted.state is S.POSTED
    async with pool.acquire() as conn:
        by_statement = await _posting(conn, p)
        discrepancies = await ledger_discrepancies(conn)
    assert by_statement["entries"] == [(account, -300), (RAIL_CLEARING, 300)]
    assert by_statement["balance"] == 700
    assert by_statement == by_helpers
    # Both balance rows moved with their entries: the clearing account's too (INV-03).
    assert discrepancies == []
