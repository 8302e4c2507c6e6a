"""Versioned SQL migrations, one PostgreSQL schema per component.

Each component keeps `NNN_description.sql` files in its own `migrations/` folder and owns one schema
(docs/architecture.md#data-ownership: no component writes another's tables). Hand-written rather
than Alembic on purpose: the project uses asyncpg without an ORM, migrations are plain SQL, and the
whole mechanism (ordered files, a version table, an advisory lock against concurrent migrators) is
small enough to read in one sitting.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

import asyncpg


@dataclass(frozen=True)
class Component:
    schema: str
    package: str  # a package with a `migrations/` folder of NNN_*.sql files


#: Every component that owns tables, in the order `payouts db migrate` applies them.
COMPONENTS = (
    Component(schema="lockservice", package="lockservice"),
    Component(schema="paydb", package="ledger"),
    Component(schema="railproxy", package="railproxy"),
)


def _migration_files(package: str) -> list[tuple[str, str]]:
    folder = resources.files(package) / "migrations"
    if not folder.is_dir():
        return []
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(name.removesuffix(".sql"), (folder / name).read_text()) for name in files]


def _lock_id(schema: str) -> int:
    return int.from_bytes(
        hashlib.sha256(f"migrate:{schema}".encode()).digest()[:8], "big", signed=True
    )


async def migrate_component(conn: asyncpg.Connection, component: Component) -> list[str]:
    """Apply the component's pending migrations; returns the versions applied now."""
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _lock_id(component.schema))
    try:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {component.schema}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {component.schema}.schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {
            r["version"]
            for r in await conn.fetch(f"SELECT version FROM {component.schema}.schema_migrations")
        }
        for version, sql in _migration_files(component.package):
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(f"SET LOCAL search_path TO {component.schema}, public")
                await conn.execute(sql)
                await conn.execute(
                    f"INSERT INTO {component.schema}.schema_migrations (version) VALUES ($1)",
                    version,
                )
            applied_now.append(f"{component.schema}/{version}")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _lock_id(component.schema))
    return applied_now


async def migrate(database_url: str, schemas: set[str] | None = None) -> list[str]:
    """Apply pending migrations of every component (or of the named schemas only)."""
    conn = await asyncpg.connect(database_url)
    try:
        applied: list[str] = []
        for component in COMPONENTS:
            if schemas is None or component.schema in schemas:
                applied += await migrate_component(conn, component)
        return applied
    finally:
        await conn.close()
