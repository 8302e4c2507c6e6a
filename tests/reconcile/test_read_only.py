"""The reconciler writes nothing: it runs under a SELECT-only role, inside a READ ONLY
transaction, and leaves every table's row count and write statistics unchanged."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from common.db_roles import RECONCILER
from reconcile.reconciler import reconcile
from tests.conftest import as_role
from tests.reconcile.conftest import World, window_until_now

COUNTED = (
    "paydb.accounts",
    "paydb.balances",
    "paydb.payouts",
    "paydb.ledger_groups",
    "paydb.ledger_entries",
    "paydb.audit_log",
    "paydb.outbox",
    "railproxy.attempts",
    "railproxy.account_fences",
)


async def snapshot(conn: asyncpg.Connection) -> dict[str, int]:
    return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in COUNTED}


async def test_reconciler_runs_under_its_select_only_role(world: World) -> None:
    """As payouts_reconciler (the migrations' role: USAGE and SELECT only), a full run with
    breaks succeeds and changes nothing; the same role cannot write (tests/test_db_roles.py
    covers every table and statement)."""
    start = await world.db_now() - timedelta(milliseconds=1)
    await world.pay(1000)
    await world.pay(2000, post=False)  # a break, so the run exercises every rule's queries
    await world.stub_payment("stray-ro")
    window = await window_until_now(world, start)
    async with world.pool.acquire() as admin:
        before = await snapshot(admin)
    conn = await asyncpg.connect(as_role(world.url, RECONCILER))
    try:
        report = await reconcile(conn, world.movements, window)
        # The negative control of the role itself: it really cannot write.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE paydb.balances SET balance = balance")
    finally:
        await conn.close()
    assert report.counts["submission_without_ledger"] == 1
    assert report.counts["movement_without_attempt"] == 1
    async with world.pool.acquire() as admin:
        assert await snapshot(admin) == before


class RecordingConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped
    """Records, for every query the reconciler issues, whether its transaction is read only."""

    read_only: list[str]

    async def fetch(self, query: str, *args: object, **kw: object) -> list[asyncpg.Record]:
        self.read_only.append(await super().fetchval("SHOW transaction_read_only"))
        return await super().fetch(query, *args, **kw)  # type: ignore[no-any-return]

    async def fetchval(self, query: str, *args: object, **kw: object) -> object:
        if query != "SHOW transaction_read_only":
            self.read_only.append(await super().fetchval("SHOW transaction_read_only"))
        return await super().fetchval(query, *args, **kw)


async def test_every_reconciler_query_runs_in_a_read_only_transaction(world: World) -> None:
    """Each query the reconciler issues sees transaction_read_only = on."""
    start = await world.db_now() - timedelta(milliseconds=1)
    await world.pay(1000)
    window = await window_until_now(world, start)
    conn = await asyncpg.connect(
        as_role(world.url, RECONCILER), connection_class=RecordingConnection
    )
    conn.read_only = []
    try:
        report = await reconcile(conn, world.movements, window)
        recorded = list(conn.read_only)
        conn.read_only.clear()
        await conn.fetch("SELECT 1")  # the recorder's negative control: outside, it is off
        assert conn.read_only == ["off"]
    finally:
        await conn.close()
    assert report.ok
    assert len(recorded) >= 7  # now(), scoped payouts, attempts, ..., proof, ambiguous
    assert set(recorded) == {"on"}
