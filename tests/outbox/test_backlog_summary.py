"""The publisher's backlog gauges (`outbox.ops.backlog_summary`) against a real PostgreSQL: the
same figures as the full count by status (`outbox_summary`, which `payouts outbox list` prints),
read from the waiting rows only, and refreshed by a running publisher at most every
`metrics_interval_s`."""

from __future__ import annotations

from collections import Counter
from functools import partial

import asyncpg
from prometheus_client import Gauge

from ledger import PayoutStore, WorkContext
from outbox.ops import backlog_summary, outbox_summary
from tests.outbox.conftest import (
    FinLedger,
    MakePublisher,
    Running,
    new_account,
    outbox_rows,
    post_payout,
)
from tests.waiting import wait_for

_GAUGED = ("pending", "delivery_failed", "conflict_blocked")


async def test_the_gauges_match_the_full_count_in_every_status(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    account = await new_account(store, ctx)
    for _ in range(3):
        await post_payout(store, ctx, account)
    rows = await outbox_rows(pool)
    # Spread the rows over every status, a different number in each (what a wrong FILTER or a
    # missing status in the WHERE would get wrong).
    statuses = ["delivered"] * 5 + ["delivery_failed"] * 3 + ["conflict_blocked"] * 2
    statuses += ["discarded"] * 1
    statuses += ["pending"] * (len(rows) - len(statuses))
    assert statuses.count("pending") >= 4
    async with pool.acquire() as conn:
        await conn.executemany(
            "UPDATE paydb.outbox SET status = $2 WHERE event_id = $1",
            [(r["event_id"], s) for r, s in zip(rows, statuses, strict=True)],
        )
    gauges, full = await backlog_summary(pool), await outbox_summary(pool)
    expected = Counter(statuses)
    assert {k: gauges[k] for k in _GAUGED} == {k: expected[k] for k in _GAUGED}
    assert {k: full[k] for k in _GAUGED} == {k: expected[k] for k in _GAUGED}
    # The same oldest pending row: its age read by two statements a moment apart.
    assert 0 <= gauges["oldest_undelivered_age_s"] <= full["oldest_undelivered_age_s"]
    async with pool.acquire() as conn:
        await conn.execute("UPDATE paydb.outbox SET status = 'delivered'")
    assert await backlog_summary(pool) == {
        "pending": 0,
        "delivery_failed": 0,
        "conflict_blocked": 0,
        "oldest_undelivered_age_s": None,
    }


async def test_a_running_publisher_refreshes_its_gauges_once_per_interval(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
    running: Running,
) -> None:
    """Rows dead-lettered after a publisher's first refresh: with an interval longer than the
    test, its dead-letter gauge keeps the figure of that refresh; with a short one (the
    control), it follows the table."""
    await finledger.set_faults(unknown_account_prefixes=["ghost-"])  # 404: dead-lettered at once
    for interval_s, follows in ((3600.0, False), (0.05, True)):
        publisher = make_publisher(metrics_interval_s=interval_s)
        gauge = publisher.metrics.dead_letters
        gauge.set(-1)  # no refresh can set it so: -1 until the first one
        halt = await running(publisher)
        try:
            await wait_for(partial(_gauge_is_not, gauge, -1))
            first = gauge._value.get()
            ghost = "ghost-" + (await new_account(store, ctx)).removeprefix("acct-")
            await store.create_account(ghost, ctx)
            ghost_rows = "payload->>'account_id' = $1"
            await wait_for(partial(_all_dead, pool, ghost_rows, ghost))
            dead = len(await outbox_rows(pool, "status = 'delivery_failed'"))
            assert dead > first
            if follows:
                await wait_for(partial(_gauge_is, gauge, dead))
            else:
                assert gauge._value.get() == first
        finally:
            await halt()


async def _all_dead(pool: asyncpg.Pool, where: str, account: str) -> bool:
    rows = await outbox_rows(pool, where, account)
    return bool(rows) and all(r["status"] == "delivery_failed" for r in rows)


async def _gauge_is(gauge: Gauge, value: float) -> bool:
    return bool(gauge._value.get() == value)


async def _gauge_is_not(gauge: Gauge, value: float) -> bool:
    return bool(gauge._value.get() != value)
