"""The publisher against real PostgreSQL and the real finance ledger (issue 8's Tests section)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from finledger import FinledgerSettings
from finledger import create_app as create_finledger
from ledger import PayoutState, PayoutStore, WorkContext
from outbox.publisher import outbox_summary
from stack.embedded.shared import free_port
from tests.outbox.conftest import (
    FinLedger,
    MakePublisher,
    Running,
    ServerThread,
    new_account,
    outbox_rows,
    post_payout,
    posting_keys,
)
from tests.waiting import wait_for


async def ledger_key(pool: asyncpg.Pool, payout_id: str) -> str:
    rows = await outbox_rows(
        pool, "event_type = 'ledger.posted' AND payload->>'payout_id' = $1", payout_id
    )
    return str(rows[0]["delivery_key"])


async def all_delivered(pool: asyncpg.Pool) -> bool:
    return all(r["status"] == "delivered" for r in await outbox_rows(pool))


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


async def test_transient_failures_eventually_one_record_payout_never_blocked(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
    running: Running,
) -> None:
    """503s and dropped connections are retried with backoff until exactly one record exists."""
    account = await new_account(store, ctx)
    payout_id = await post_payout(store, ctx, account)
    assert (await store.get_payout(payout_id)).state is PayoutState.POSTED  # before any delivery
    key = await ledger_key(pool, payout_id)
    await finledger.set_faults(
        rules=[
            {"correlation_prefix": key, "action": "fail", "status": 503, "times": 2},
            {"correlation_prefix": key, "action": "drop", "times": 1},
        ]
    )
    publisher = make_publisher()
    with capture_logs() as logs:
        halt = await running(publisher)
        await wait_for(lambda: all_delivered(pool))
        await halt()
    row = (await outbox_rows(pool, "delivery_key = $1", key))[0]
    assert (row["last_outcome"], row["attempts"]) == ("completed", 4)
    assert (await finledger.requests())["counts"][key] == 4
    assert [r["correlation_id"] for r in await finledger.records()].count(key) == 1
    retries = [
        e for e in logs if e["event"] == "outbox.retry_scheduled" and e["delivery_key"] == key
    ]
    assert len(retries) == 3 and all(e["outcome"] == "retryable_failure" for e in retries)
    assert publisher.metrics.deliveries.labels(outcome="retryable_failure")._value.get() == 3


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


async def test_downstream_down_while_posting_then_backlog_drains(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    make_publisher: MakePublisher,
    running: Running,
) -> None:
    """With the ledger down every payout still posts; when it comes up the backlog drains."""
    port = free_port()
    publisher = make_publisher(
        finledger_url=f"http://127.0.0.1:{port}", max_attempts=1000, max_delay_s=0.2
    )
    halt = await running(publisher)
    account = await new_account(store, ctx)
    payouts = [await post_payout(store, ctx, account) for _ in range(5)]
    states = [(await store.get_payout(p)).state for p in payouts]
    assert states == [PayoutState.POSTED] * 5

    async def failing_seen() -> bool:
        rows = await outbox_rows(pool)
        return all(r["attempts"] >= 1 and r["last_outcome"] == "retryable_failure" for r in rows)

    await wait_for(failing_seen)
    backlog = (await publisher.refresh_metrics())["pending"]
    assert (
        backlog == len(await outbox_rows(pool))
        and publisher.metrics.backlog._value.get() == backlog
    )
    server = ServerThread(create_finledger(FinledgerSettings()), port=port)
    server.start()
    try:
        await wait_for(lambda: all_delivered(pool))
        await halt()
        fl = FinLedger(server.url)
        assert await fl.count() == len(await outbox_rows(pool))
        assert len(await posting_keys(pool)) == 6
        assert set((await fl.requests())["counts"]) == {
            r["delivery_key"] for r in await outbox_rows(pool)
        }
    finally:
        server.stop()
    summary = await publisher.refresh_metrics()
    assert summary["pending"] == 0 and publisher.metrics.oldest_age._value.get() == 0


async def test_unknown_account_is_dead_lettered_with_zero_retries(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """A 404 (unknown account) sends the row to delivery_failed at once: one attempt, no retry."""
    ghost = "ghost-" + (await new_account(store, ctx)).removeprefix("acct-")
    await store.create_account(ghost, ctx)
    await finledger.set_faults(unknown_account_prefixes=["ghost-"])
    publisher = make_publisher()
    with capture_logs() as logs:
        for _ in range(3):
            await publisher.drain()
    failed = await outbox_rows(pool, "payload->>'account_id' = $1", ghost)
    assert failed and all(
        (r["status"], r["attempts"], r["last_outcome"], r["next_retry_at"])
        == ("delivery_failed", 1, "permanent_failure", None)
        for r in failed
    )
    counts = (await finledger.requests())["counts"]
    assert all(counts[r["delivery_key"]] == 1 for r in failed)
    dead = [e for e in logs if e["event"] == "outbox.dead_lettered"]
    assert len(dead) == len(failed) and {e["reason"] for e in dead} == {"permanent"}
    summary = await publisher.refresh_metrics()
    assert summary["delivery_failed"] == len(failed)
    assert publisher.metrics.dead_letters._value.get() == len(failed)


async def test_retries_exhausted_become_dead_letters(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """A row that keeps failing transiently is dead-lettered after exactly max_attempts tries."""
    account = await new_account(store, ctx)
    await finledger.set_faults(rules=[{"account_id": account, "action": "fail", "status": 503}])
    publisher = make_publisher(max_attempts=3)

    async def settled() -> bool:
        await publisher.drain()
        return all(r["status"] != "pending" for r in await outbox_rows(pool))

    with capture_logs() as logs:
        await wait_for(settled)
    rows = await outbox_rows(pool)
    assert {(r["status"], r["attempts"], r["last_outcome"]) for r in rows} == {
        ("delivery_failed", 3, "retryable_failure")
    }
    assert all(v == 3 for v in (await finledger.requests())["counts"].values())
    assert {e["reason"] for e in logs if e["event"] == "outbox.dead_lettered"} == {
        "attempts_exhausted"
    }


async def test_backoff_rows_are_skipped_by_the_pending_scan(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """A row backing off is not claimed while later rows are delivered; once due it is claimed."""
    blocked = await new_account(store, ctx)
    await finledger.set_faults(rules=[{"account_id": blocked, "action": "fail", "status": 503}])
    publisher = make_publisher(base_delay_s=600, max_delay_s=600)
    await publisher.drain()
    waiting = await outbox_rows(pool, "payload->>'account_id' = $1", blocked)
    assert waiting and all(r["backing_off"] and r["attempts"] == 1 for r in waiting)
    other = await new_account(store, ctx)
    await post_payout(store, ctx, other)
    done = await publisher.drain()
    assert done == len(await outbox_rows(pool, "payload->>'account_id' = $1", other))
    assert (
        await outbox_rows(pool, "payload->>'account_id' = $1 AND status <> 'delivered'", other)
        == []
    )
    assert [
        r["attempts"] for r in await outbox_rows(pool, "payload->>'account_id' = $1", blocked)
    ] == [1] * len(waiting)
    # negative control: once due, the same rows are claimed again
    async with pool.acquire() as conn:
        await conn.execute("UPDATE paydb.outbox SET next_retry_at = now() WHERE status = 'pending'")
    assert await publisher.drain() == len(waiting)


async def test_order_per_account_is_not_guaranteed_occurred_at_restores_it(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """As documented: a failing earlier posting does not hold back a later one, so arrival order
    can differ from occurrence order; each record carries occurred_at, which restores it."""
    account = await new_account(store, ctx)
    first = await post_payout(store, ctx, account)
    second = await post_payout(store, ctx, account)
    first_key, second_key = await ledger_key(pool, first), await ledger_key(pool, second)
    await finledger.set_faults(
        rules=[{"correlation_prefix": first_key, "action": "fail", "times": 1}]
    )
    publisher = make_publisher(batch_size=100, base_delay_s=0.05, max_delay_s=0.05)
    await publisher.process_once()

    async def first_delivered() -> bool:
        await publisher.process_once()
        return bool(
            (await outbox_rows(pool, "delivery_key = $1", first_key))[0]["status"] == "delivered"
        )

    await wait_for(first_delivered)
    records = [
        r
        for r in await finledger.records(account)
        if r["event_type"] == "ledger.posted" and r["payload"].get("kind") == "payout"
    ]
    arrival = [r["correlation_id"] for r in sorted(records, key=lambda r: r["seq"])]
    occurred = [r["correlation_id"] for r in sorted(records, key=lambda r: r["occurred_at"])]
    assert arrival == [second_key, first_key]
    assert occurred == [first_key, second_key]


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


async def test_notify_wakes_the_publisher_without_polling(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
    running: Running,
) -> None:
    """With a one-hour poll interval, a committed posting is still delivered (LISTEN/NOTIFY)."""
    publisher = make_publisher(poll_interval_s=3600)
    halt = await running(publisher)
    await wait_for(lambda: publisher_listening(pool))
    account = await new_account(store, ctx)
    await post_payout(store, ctx, account)
    await wait_for(lambda: all_delivered(pool))
    await halt()
    assert await finledger.count() == len(await outbox_rows(pool))


async def publisher_listening(pool: asyncpg.Pool) -> bool:
    async with pool.acquire() as conn:
        n = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN%'"
        )
    return bool(n)


async def test_metrics_have_no_identifier_labels(make_publisher: MakePublisher) -> None:
    """Every outbox metric is labelled by outcome at most (NFR-09)."""
    publisher = make_publisher()
    labels = {
        name
        for metric in publisher.metrics.registry.collect()
        for sample in metric.samples
        for name in sample.labels
    }
    assert labels <= {"outcome"}
    assert json.dumps(sorted(labels)) == '["outcome"]'
