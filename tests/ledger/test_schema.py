"""The database-level guards: transition trigger, terminal freeze, ledger balance and
append-only triggers, and the proof query (each with a negative control)."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from common.migrate import migrate
from ledger import TRANSITIONS, PayoutStore, WorkContext
from ledger.queries import ledger_discrepancies
from tests.ledger.conftest import funded_account, new_id


async def test_migration_is_idempotent(paydb_url: str) -> None:
    """Running the migrations again on a migrated database applies nothing."""
    assert await migrate(paydb_url, schemas={"paydb"}) == []


async def test_db_transition_table_equals_code_table(pool: asyncpg.Pool) -> None:
    """The table the trigger consults is exactly ledger.states.TRANSITIONS."""
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT from_state, to_state FROM paydb.payout_transitions")
    assert {(r["from_state"], r["to_state"]) for r in rows} == {
        (str(a), str(b)) for a, b in TRANSITIONS
    }


async def _pending_payout(store: PayoutStore, ctx: WorkContext) -> str:
    account = await funded_account(store, ctx, 1000)
    payout_id = new_id("po")
    await store.create_payout(payout_id, account, 100, ctx)
    return payout_id


async def test_trigger_refuses_a_pair_not_in_the_table(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """A raw UPDATE PENDING -> POSTED (skipping the table) is refused by the database."""
    payout_id = await _pending_payout(store, ctx)
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.CheckViolationError, match="not an allowed transition"):
            await conn.execute(
                "UPDATE paydb.payouts SET state = 'POSTED' WHERE payout_id = $1", payout_id
            )
        # Negative control: a listed pair goes through the same trigger.
        await conn.execute(
            "UPDATE paydb.payouts SET state = 'CLAIMED' WHERE payout_id = $1", payout_id
        )


async def test_trigger_freezes_terminal_payouts(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """Once FAILED, no raw UPDATE may change the payout's state or fence (INV-08)."""
    payout_id = await _pending_payout(store, ctx)
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE paydb.payouts SET state = 'FAILED' WHERE payout_id = $1", payout_id
        )
        for statement in (
            "UPDATE paydb.payouts SET state = 'CLAIMED' WHERE payout_id = $1",
            "UPDATE paydb.payouts SET fence = 99 WHERE payout_id = $1",
        ):
            with pytest.raises(asyncpg.CheckViolationError, match="terminal"):
                await conn.execute(statement, payout_id)
        with pytest.raises(asyncpg.RestrictViolationError):
            await conn.execute("DELETE FROM paydb.payouts WHERE payout_id = $1", payout_id)


async def test_trigger_refuses_changing_amount(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """A payout's amount, account and client reference are immutable."""
    payout_id = await _pending_payout(store, ctx)
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.CheckViolationError, match="immutable"):
            await conn.execute(
                "UPDATE paydb.payouts SET amount = 1 WHERE payout_id = $1", payout_id
            )


async def _insert_group(conn: asyncpg.Connection, entries: list[tuple[str, int]]) -> uuid.UUID:
    group_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO paydb.ledger_groups (group_id, kind, correlation_id)"
        " VALUES ($1, 'funding', 'test')",
        group_id,
    )
    for account, amount in entries:
        await conn.execute(
            "INSERT INTO paydb.ledger_entries (group_id, account_id, amount) VALUES ($1, $2, $3)",
            group_id,
            account,
            amount,
        )
    return group_id


@pytest.mark.parametrize(
    "entries",
    [
        [("funding_source", -100), ("rail_clearing", 99)],
        [("funding_source", -100)],
        [],
    ],
    ids=["sum-not-zero", "single-entry", "no-entries"],
)
async def test_unbalanced_group_cannot_commit(
    pool: asyncpg.Pool, entries: list[tuple[str, int]]
) -> None:
    """The deferred constraint trigger refuses to COMMIT a group that is not balanced."""
    async with pool.acquire() as conn:
        before = await conn.fetchval("SELECT count(*) FROM paydb.ledger_groups")
        with pytest.raises(asyncpg.CheckViolationError, match="unbalanced"):
            async with conn.transaction():
                await _insert_group(conn, entries)
        assert await conn.fetchval("SELECT count(*) FROM paydb.ledger_groups") == before


async def test_balanced_group_commits_and_entries_are_append_only(pool: asyncpg.Pool) -> None:
    """A balanced group commits (negative control); UPDATE, DELETE, TRUNCATE of entries fail."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            group_id = await _insert_group(conn, [("funding_source", -5), ("rail_clearing", 5)])
            # Keep balances equal to entries so the rest of the module's proofs hold.
            await conn.execute(
                "UPDATE paydb.balances SET balance = balance - 5"
                " WHERE account_id = 'funding_source'"
            )
            await conn.execute(
                "UPDATE paydb.balances SET balance = balance + 5 WHERE account_id = 'rail_clearing'"
            )
        for statement in (
            "UPDATE paydb.ledger_entries SET amount = amount * 2 WHERE group_id = $1",
            "DELETE FROM paydb.ledger_entries WHERE group_id = $1",
            "UPDATE paydb.ledger_groups SET correlation_id = 'x' WHERE group_id = $1",
            "DELETE FROM paydb.ledger_groups WHERE group_id = $1",
        ):
            with pytest.raises(asyncpg.RestrictViolationError, match="append-only"):
                await conn.execute(statement, group_id)
        with pytest.raises(asyncpg.RestrictViolationError, match="append-only"):
            await conn.execute("TRUNCATE paydb.ledger_entries CASCADE")
        with pytest.raises(asyncpg.RestrictViolationError, match="append-only"):
            await conn.execute("DELETE FROM paydb.audit_log")
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM paydb.ledger_entries WHERE group_id = $1", group_id
            )
            == 2
        )


async def test_proof_query_sees_a_drifted_balance(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext
) -> None:
    """The proof query is empty on a consistent ledger and reports a balance that drifted."""
    account = await funded_account(store, ctx, 700)
    async with pool.acquire() as conn:
        assert await ledger_discrepancies(conn) == []
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute(
                "UPDATE paydb.balances SET balance = balance + 1 WHERE account_id = $1", account
            )
            found = await ledger_discrepancies(conn)
        finally:
            await tx.rollback()
        assert [(d.kind, d.subject, d.stored, d.computed) for d in found] == [
            ("account", account, 701, 700)
        ]
        assert await ledger_discrepancies(conn) == []


async def test_proof_query_sees_an_unbalanced_group(pool: asyncpg.Pool) -> None:
    """With the deferred check postponed inside a transaction, the proof query sees the group."""
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            group_id = await _insert_group(conn, [("funding_source", -3)])
            found = await ledger_discrepancies(conn)
        finally:
            await tx.rollback()
    kinds = {(d.kind, d.subject) for d in found}
    assert ("group", str(group_id)) in kinds
    assert ("account", "funding_source") in kinds
