"""The checker writes nothing: it runs under a SELECT-only role, inside READ ONLY transactions,
and leaves every table's row count unchanged."""

from __future__ import annotations

import asyncpg
import pytest

from common.db_roles import CHECKER
from invariants.checker import check_invariants, postgres_grant_source, stub_movement_source
from tests.conftest import as_role
from tests.invariants.conftest import World, violated

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
    "lockservice.grant_history",
    "lockservice.sessions",
    "lockservice.holders",
)


async def row_counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in COUNTED}


async def test_checker_runs_under_its_select_only_role(world: World) -> None:
    """As payouts_checker (the migrations' role: USAGE and SELECT on the three schemas), a run
    that finds a violation succeeds, every table keeps its row count, and the same role fails
    to write (tests/test_db_roles.py covers every table and statement)."""
    a = await world.account()
    payout_id = await world.pay(a, 1000)
    await world.stub_payment(payout_id, a)  # a violation, so every rule sees data
    async with world.pool.acquire() as admin:
        before = await row_counts(admin)
    url = as_role(world.url, CHECKER)
    conn = await asyncpg.connect(url)
    try:
        report = await check_invariants(
            conn, stub_movement_source(world.stub.url), postgres_grant_source(url)
        )
        # The negative control of the role itself: it really cannot write.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE paydb.balances SET fence = fence")
    finally:
        await conn.close()
    assert violated(report) == {"INV-02", "INV-09"}  # POSTED once, paid twice
    async with world.pool.acquire() as admin:
        assert await row_counts(admin) == before


class RecordingConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped
    """Records, for every query issued through it, whether its transaction is read only."""

    read_only: list[str]

    async def fetch(self, query: str, *args: object, **kw: object) -> list[asyncpg.Record]:
        self.read_only.append(await super().fetchval("SHOW transaction_read_only"))
        return await super().fetch(query, *args, **kw)  # type: ignore[no-any-return]


async def test_every_checker_query_runs_in_a_read_only_transaction(world: World) -> None:
    """Each query of the database snapshot sees transaction_read_only = on."""
    a = await world.account()
    await world.pay(a, 1000)
    conn = await asyncpg.connect(as_role(world.url, CHECKER), connection_class=RecordingConnection)
    conn.read_only = []
    try:
        report = await check_invariants(conn, stub_movement_source(world.stub.url), world.grants())
        recorded = list(conn.read_only)
        conn.read_only.clear()
        await conn.fetch("SELECT 1")  # the recorder's negative control: outside, it is off
        assert conn.read_only == ["off"]
    finally:
        await conn.close()
    assert report.ok
    assert len(recorded) >= 7  # writes, transitions, payouts, balances, attempts, fences, proof
    assert set(recorded) == {"on"}
