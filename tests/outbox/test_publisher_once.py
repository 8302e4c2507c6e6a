"""The publisher against real PostgreSQL and the real finance ledger (issue 8's Tests section):
each posting becomes exactly one record, whether it is delivered twice, reprocessed after it
was delivered, met by a conflicting record (blocked, never retried) or drained by several
publishers at once."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from ledger import PayoutStore, WorkContext
from outbox.publisher import outbox_summary
from tests.outbox.conftest import (
    FinLedger,
    MakePublisher,
    Running,
    all_delivered,
    ledger_key,
    new_account,
    outbox_rows,
    post_payout,
)
from tests.waiting import wait_for


async def test_correlation_ids_follow_the_seed_pattern(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """A posting's key is {account}:{payout}:{group}; a payout event's is {account}:{payout}:{type}."""
    account = await new_account(store, ctx)
    payout_id = await post_payout(store, ctx, account)
    group = (await store.get_payout(payout_id)).ledger_group_id
    keys = {
        r["event_type"]: r["delivery_key"]
        for r in await outbox_rows(pool, "payload->>'payout_id' = $1", payout_id)
    }
    assert keys["ledger.posted"] == f"{account}:{payout_id}:{group}"
    assert keys["payout.posted"] == f"{account}:{payout_id}:payout.posted"
    assert len(set(keys.values())) == 6


async def test_same_posting_delivered_twice_is_one_record(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """A posting whose first delivery is recorded but the reply lost is sent again: one record."""
    account = await new_account(store, ctx)
    payout_id = await post_payout(store, ctx, account)
    key = await ledger_key(pool, payout_id)
    await finledger.set_faults(
        rules=[{"correlation_prefix": key, "action": "drop_after_record", "times": 1}]
    )
    publisher = make_publisher()

    async def drained() -> bool:
        await publisher.drain()
        return await all_delivered(pool)

    await wait_for(drained)
    history = await finledger.requests()
    assert history["counts"][key] == 2  # really delivered twice
    row = (await outbox_rows(pool, "delivery_key = $1", key))[0]
    assert (row["status"], row["last_outcome"], row["attempts"]) == (
        "delivered",
        "duplicate_completed",
        2,
    )
    records = [r for r in await finledger.records() if r["correlation_id"] == key]
    assert len(records) == 1
    assert await finledger.count() == len(await outbox_rows(pool))
    # local dedup: staging the same posting again is refused by the unique constraint
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO paydb.outbox (event_id, event_type, correlation_id, contract_version, payload)"
                " VALUES (gen_random_uuid(), 'ledger.posted', $1, 'paydb.v1', '{}')",
                key,
            )


async def test_conflict_is_blocked_and_never_retried_automatically(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """A 409 leaves the row conflict_blocked after one attempt; later scans never send it again."""
    account = await new_account(store, ctx)
    payout_id = await post_payout(store, ctx, account)
    key = await ledger_key(pool, payout_id)
    forged = {
        "event_id": "x",
        "event_type": "ledger.posted",
        "account_id": account,
        "occurred_at": "2020-01-01T00:00:00+00:00",
        "contract_version": "paydb.v1",
        "payload": {"amount": -1},
    }
    assert (await finledger.write(key, forged)).status_code == 201
    publisher = make_publisher()
    with capture_logs() as logs:
        for _ in range(3):
            await publisher.drain()
    row = (await outbox_rows(pool, "delivery_key = $1", key))[0]
    assert (row["status"], row["last_outcome"], row["attempts"]) == (
        "conflict_blocked",
        "conflict_blocked",
        1,
    )
    assert (await finledger.requests())["counts"][key] == 2  # the forged write + one attempt
    assert [e["event"] for e in logs if e.get("delivery_key") == key] == ["outbox.conflict_blocked"]
    summary = await outbox_summary(pool)
    assert summary["conflict_blocked"] == 1 and summary["pending"] == 0


async def test_reprocessing_a_delivered_row_is_duplicate_completed(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """A delivered row processed again (crash before its outcome was written) changes nothing."""
    account = await new_account(store, ctx)
    await post_payout(store, ctx, account)
    publisher = make_publisher()
    await publisher.drain()
    assert await all_delivered(pool)
    before = await finledger.records()
    async with pool.acquire() as conn:  # the crash window: delivered downstream, not yet marked
        await conn.execute("UPDATE paydb.outbox SET status = 'pending'")
    done = await publisher.drain()
    assert done == len(before)
    rows = await outbox_rows(pool)
    assert {r["last_outcome"] for r in rows} == {"duplicate_completed"}
    assert {r["status"] for r in rows} == {"delivered"}
    assert await finledger.records() == before


async def test_several_publishers_never_send_a_row_twice_at_once(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
    running: Running,
) -> None:
    """Three publishers drain one outbox: every row is sent exactly once, never overlapping."""
    account = await new_account(store, ctx)
    for _ in range(8):
        await post_payout(store, ctx, account)
    await finledger.set_faults(latency_s=0.02)
    publishers = [make_publisher(batch_size=4) for _ in range(3)]
    halts = [await running(p) for p in publishers]
    await wait_for(lambda: all_delivered(pool))
    for halt in halts:
        await halt()
    history = await finledger.requests()
    rows = await outbox_rows(pool)
    assert history["counts"] == {r["delivery_key"]: 1 for r in rows}
    assert not overlapping(history["requests"])
    assert {r["attempts"] for r in rows} == {1}
    # negative control: the overlap checker does see two concurrent sends of one id
    await finledger.reset()
    await finledger.set_faults(latency_s=0.2)
    body = {
        "event_id": "e",
        "event_type": "t",
        "account_id": "a",
        "occurred_at": "x",
        "contract_version": "v",
        "payload": {},
    }
    await asyncio.gather(finledger.write("k:1", body), finledger.write("k:1", body))
    assert overlapping((await finledger.requests())["requests"])


def overlapping(requests: list[dict[str, Any]]) -> bool:
    """True when two requests for one correlation id were in flight at the same time."""
    by_key: dict[str, list[tuple[int, int]]] = {}
    for r in requests:
        finished = 10**9 if r["finished"] is None else int(r["finished"])  # still in flight
        by_key.setdefault(r["correlation_id"], []).append((int(r["started"]), finished))
    for spans in by_key.values():
        spans.sort()
        if any(b[0] < a[1] for a, b in itertools.pairwise(spans)):
            return True
    return False
