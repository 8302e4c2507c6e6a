"""Versioned SQL migrations, one PostgreSQL schema per component.

Each component keeps `NNN_description.sql` files in its own `migrations/` folder and owns one schema
(docs/architecture.md#data-ownership: no component writes another's tables). Hand-written rather
than Alembic on purpose: the project uses asyncpg without an ORM, migrations are plain SQL, and the
whole mechanism (ordered files, a version table, an advisory lock against concurrent migrators) is
small enough to read in one sitting.

After the migrations, `migrate` applies the per-component roles and grants (common/db_roles.py)
when it runs with the admin DSN. A component that calls `migrate` at start-up with its own role
(the lock server, the rail proxy) finds nothing pending and changes nothing; if something is
pending it stops with a one-line `MigrationError` naming the admin command to run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

import asyncpg

from common.db_roles import apply_roles
from common.logs import get_logger

log = get_logger("common.migrate")


class MigrationError(RuntimeError):
    """Pending migrations that the connected role may not apply."""


@dataclass(frozen=True)
class Component:
    schema: str
    package: str  # a package with a `migrations/` folder of NNN_*.sql files


#: Every component that owns tables, in the order `payouts db migrate` applies them.
COMPONENTS = (
    Component(schema="lockservice", package="lockservice.server"),
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


async def _pending(conn: asyncpg.Connection, component: Component) -> bool:
    table = f"{component.schema}.schema_migrations"
    if await conn.fetchval("SELECT to_regclass($1)", table) is None:
        return True
    try:
        done = {r["version"] for r in await conn.fetch(f"SELECT version FROM {table}")}
    except asyncpg.InsufficientPrivilegeError:
        return True
    return any(v not in done for v, _ in _migration_files(component.package))


async def _is_admin(conn: asyncpg.Connection) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
        )
    )


async def migrate(
    database_url: str,
    schemas: set[str] | None = None,
    *,
    passwords: Mapping[str, str] | None = None,
) -> list[str]:
    """Apply pending migrations of every component (or of the named schemas only), then the
    roles and grants (admin DSN only; `passwords` by role name, from configuration)."""
    conn = await asyncpg.connect(database_url)
    try:
        components = [c for c in COMPONENTS if schemas is None or c.schema in schemas]
        pending = [c.schema for c in components if await _pending(conn, c)]
        admin = await _is_admin(conn)
        if not admin and not pending:
            return []  # a component's start-up check on its own role: nothing to do
        applied: list[str] = []
        try:
            for component in components:
                applied += await migrate_component(conn, component)
        except asyncpg.InsufficientPrivilegeError as exc:
            user = await conn.fetchval("SELECT current_user")
            raise MigrationError(
                f"schema(s) {', '.join(pending)} need migrations that role {user} may not "
                "apply: run `payouts db migrate` with the admin DSN ($DATABASE_URL) first"
            ) from exc
        if admin:
            await apply_roles(conn, passwords)
        else:
            # A schema owner without CREATEROLE (a deployment's own migrator role) may run
            # the DDL; the roles and grants are then the deployment's business.
            log.warning("db.roles_not_applied", reason="connected role lacks CREATEROLE")
        return applied
    finally:
        await conn.close()
