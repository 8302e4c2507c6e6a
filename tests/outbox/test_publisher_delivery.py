"""The publisher against real PostgreSQL and the real finance ledger (issue 8's Tests section):
how it delivers through failures (retries with backoff, dead letters, a backlog drained once the
ledger is back, rows backing off skipped, per-account order restored by occurred_at), woken by
NOTIFY, its metrics free of identifier labels."""

from __future__ import annotations

import json

import asyncpg
from structlog.testing import capture_logs

from finledger import FinledgerSettings
from finledger import create_app as create_finledger
from ledger import PayoutState, PayoutStore, WorkContext
from stack.embedded.shared import free_port
from tests.outbox.conftest import (
    FinLedger,
    MakePublisher,
    Running,
    all_delivered,
    ledger_key,
    new_account,
    outbox_rows,
    post_payout,
    posting_keys,
)
from tests.servers import ServerThread
from tests.waiting import wait_for


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
