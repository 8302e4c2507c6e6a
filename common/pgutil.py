"""Small helpers around PostgreSQL: URLs, throwaway databases (tests, `payouts up`) and pools."""

from __future__ import annotations

import re
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database."""
    if not _DB_NAME.match(database):
        raise ValueError(f"unsafe database name {database!r}")
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


async def create_database(server_url: str, prefix: str = "payouts_t") -> str:
    """Create a fresh, uniquely named database on the server and return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(server_url, name)


async def drop_database(server_url: str, database_url: str) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    if not _DB_NAME.match(name):
        raise ValueError(f"unsafe database name {name!r}")
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing beyond asyncpg's own rollback of an open transaction."""


async def create_pool(
    url: str, *, idle_in_transaction_s: float | None = None, **kwargs: Any
) -> asyncpg.Pool:
    """An asyncpg pool whose connections go back to the pool without a reset round trip.

    `idle_in_transaction_s`: PostgreSQL ends a session of this pool that sits idle inside a
    transaction for longer (rolling it back), whatever role or server it connects to (set per
    connection, so it holds against an external DATABASE_URL and an admin DSN too, and overrides
    the role's default, common.db_roles.IDLE_IN_TRANSACTION_S). A holder frozen between its
    UPDATEs and its COMMIT then keeps its rows locked for at most this long, and its writes never
    commit (docs/payment-database.md, "Bounded blocking").

    asyncpg's default reset sends `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL;` on every release, a second round trip per query: the lock server spent 15% of
    its time there under load. Our services keep no session state on pooled connections (no
    SET without LOCAL, no LISTEN, no advisory lock, no cursor outside a transaction), and asyncpg
    still rolls back a transaction left open, so the reset buys nothing. Code that needs session
    state takes its own connection (`asyncpg.connect`), as the LISTEN connections do.
    """
    if idle_in_transaction_s is not None:
        if idle_in_transaction_s <= 0:
            raise ValueError("idle_in_transaction_s must be positive (0 would switch it off)")
        settings = dict(kwargs.pop("server_settings", None) or {})
        settings["idle_in_transaction_session_timeout"] = str(round(idle_in_transaction_s * 1000))
        kwargs["server_settings"] = settings
    pool: asyncpg.Pool = await asyncpg.create_pool(url, reset=_keep_session, **kwargs)
    return pool
