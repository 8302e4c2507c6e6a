"""Small helpers around PostgreSQL URLs and throwaway databases (used by tests and `payouts up`)."""

from __future__ import annotations

import re
import uuid
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
