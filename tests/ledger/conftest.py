"""Fixtures for the payment-database tests: a fresh, migrated database per test module.

`pool` is the admin DSN (setup, inspection, raw statements against the triggers); every store
runs on `role_pool`, the payment store's own role (payouts_paydb, docs/database-roles.md).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest

from common.db_roles import PAYDB
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from ledger import PayoutStore, WorkContext
from tests.conftest import as_role

TABLES = (
    "accounts",
    "balances",
    "payouts",
    "ledger_groups",
    "ledger_entries",
    "audit_log",
    "outbox",
)


@pytest.fixture(scope="module")
async def paydb_url(pg_server_url: str) -> AsyncIterator[str]:
    """A fresh database with only the paydb schema migrated, dropped after the module."""
    url = await create_database(pg_server_url, prefix="paydb_t")
    await migrate(url, schemas={"paydb"})
    try:
        yield url
    finally:
        await drop_database(pg_server_url, url)


@pytest.fixture(scope="module")
async def pool(paydb_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(paydb_url, min_size=1, max_size=24)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="module")
async def role_pool(paydb_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The payment store's role (payouts_paydb): what the workers connect as."""
    pool = await asyncpg.create_pool(as_role(paydb_url, PAYDB), min_size=1, max_size=24)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="module")
def store(role_pool: asyncpg.Pool) -> PayoutStore:
    return PayoutStore(role_pool)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def funded_account(store: PayoutStore, ctx: WorkContext, amount: int) -> str:
    account_id = new_id("acct")
    await store.create_account(account_id, ctx)
    if amount:
        await store.fund_account(account_id, amount, ctx)
    return account_id


async def row_counts(pool: asyncpg.Pool) -> dict[str, int]:
    async with pool.acquire() as conn:
        return {t: int(await conn.fetchval(f"SELECT count(*) FROM paydb.{t}")) for t in TABLES}


@asynccontextmanager
async def rolled_back(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A connection inside a transaction that is always rolled back: rows a test writes there,
    to read them beside the code's own, are never kept (the ledger's and the outbox's tables let
    no row be deleted, and their unique keys would refuse the code's rows after them)."""
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            yield conn
        finally:
            await tx.rollback()
