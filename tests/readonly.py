"""What the read-only components' tests share: the reconciler and the invariant checker both run
under a SELECT-only role inside READ ONLY transactions (docs/database-roles.md), and their tests
prove it the same way: every table's row count unchanged, and every query seen in a read-only
transaction (tests/reconcile/test_read_only.py, tests/invariants/test_read_only.py)."""

from __future__ import annotations

import asyncpg

#: The payment database's and the rail proxy's tables, which both components read.
PAYDB_AND_RAILPROXY = (
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
#: The PostgreSQL lock backend's tables, which the checker reads too.
LOCKSERVICE = ("lockservice.grant_history", "lockservice.sessions", "lockservice.holders")


async def row_counts(conn: asyncpg.Connection, tables: tuple[str, ...]) -> dict[str, int]:
    """The row count of each table (read with an admin connection, before and after a run)."""
    return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in tables}


class RecordingConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped
    """Records, for every query issued through it, whether its transaction is read only."""

    read_only: list[str]

    async def fetch(self, query: str, *args: object, **kw: object) -> list[asyncpg.Record]:
        self.read_only.append(await super().fetchval("SHOW transaction_read_only"))
        return await super().fetch(query, *args, **kw)  # type: ignore[no-any-return]

    async def fetchval(self, query: str, *args: object, **kw: object) -> object:
        if query != "SHOW transaction_read_only":
            self.read_only.append(await super().fetchval("SHOW transaction_read_only"))
        return await super().fetchval(query, *args, **kw)
