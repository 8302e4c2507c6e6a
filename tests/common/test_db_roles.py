"""Each component's PostgreSQL role can do only what its component does (NFR-13, issue #13).

Real PostgreSQL, a database migrated with the admin DSN: for every role, a write to another
component's table is refused with InsufficientPrivilegeError; the reconciler's and the checker's
roles cannot write anything (INSERT/UPDATE/DELETE/TRUNCATE on every table, CREATE in every
schema, temporary tables); what each role may do is shown by the component suites, whose
fixtures connect with these roles. Negative control: the same write as the admin DSN, and after
a grant through the real mechanism (GRANT), succeeds — the refusal is the role's, not the SQL's.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from common import db_roles
from common.db_roles import (
    CHECKER,
    LOCKSERVICE,
    OUTBOX,
    PAYDB,
    RAILPROXY,
    RECONCILER,
    ROLE_NAMES,
    RoleConfigError,
    apply_roles,
    read_passwords,
)
from common.migrate import MigrationError, migrate
from common.pgutil import create_database, drop_database
from tests.conftest import as_role

#: One harmless write per table: (table, statement). Each one would succeed for a role that
#: held the privilege (the row values satisfy the constraints or touch no row).
WRITES = {
    "lockservice.epochs": "INSERT INTO lockservice.epochs (prefix) VALUES ('roles-test/')",
    "lockservice.key_counters": "UPDATE lockservice.key_counters SET last_token = last_token",
    "lockservice.holders": "DELETE FROM lockservice.holders WHERE false",
    "lockservice.audit": "UPDATE lockservice.audit SET reason = reason",
    "railproxy.account_fences": "INSERT INTO railproxy.account_fences (account_id, high_token)"
    " VALUES ('roles-test', 1)",
    "railproxy.attempts": "UPDATE railproxy.attempts SET outcome = outcome",
    "railproxy.budget_slots": "UPDATE railproxy.budget_slots SET holder = holder",
    "paydb.accounts": "INSERT INTO paydb.accounts (account_id, kind) VALUES ('roles-t', 'customer')",
    "paydb.balances": "UPDATE paydb.balances SET fence = fence",
    "paydb.payouts": "UPDATE paydb.payouts SET fence = fence",
    "paydb.ledger_entries": "DELETE FROM paydb.ledger_entries WHERE false",
    "paydb.audit_log": "DELETE FROM paydb.audit_log WHERE false",
    "paydb.outbox": "UPDATE paydb.outbox SET status = status",
}

#: The tables each role's component writes: every other table of WRITES must be refused.
OWN = {
    LOCKSERVICE: {t for t in WRITES if t.startswith("lockservice.")} - {"lockservice.audit"},
    RAILPROXY: {"railproxy.account_fences", "railproxy.attempts", "railproxy.budget_slots"},
    PAYDB: {"paydb.accounts", "paydb.balances", "paydb.payouts"},
    OUTBOX: {"paydb.outbox"},
    RECONCILER: set(),
    CHECKER: set(),
}


@pytest.fixture(scope="module")
def roles_db(pg_server_url: str) -> Iterator[str]:
    """A database with every schema migrated by the admin DSN (roles and grants applied)."""
    url = asyncio.run(create_database(pg_server_url, prefix="roles_t"))
    asyncio.run(migrate(url))
    yield url
    asyncio.run(drop_database(pg_server_url, url))


@pytest.fixture
async def admin(roles_db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(roles_db)
    yield conn
    await conn.close()


async def _refused(url: str, statement: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            try:
                await conn.execute(statement)
            except asyncpg.InsufficientPrivilegeError:
                return True
            raise _Rollback  # allowed: undo it, report "not refused"
    except _Rollback:
        return False
    finally:
        await conn.close()


class _Rollback(Exception):
    pass


@pytest.mark.parametrize("role", ROLE_NAMES)
async def test_a_role_cannot_write_another_components_tables(roles_db: str, role: str) -> None:
    url = as_role(roles_db, role)
    foreign = sorted(set(WRITES) - OWN[role])
    allowed = [t for t in foreign if not await _refused(url, WRITES[t])]
    assert allowed == [], f"{role} may write {allowed}"
    # Its own tables it may write (the component suites show the rest of what it does).
    refused_own = [t for t in sorted(OWN[role]) if await _refused(url, WRITES[t])]
    assert refused_own == [], f"{role} is refused its own {refused_own}"


async def test_the_refusal_is_the_roles_not_the_statements(roles_db: str) -> None:
    """Negative control: the admin runs every write; a GRANT through the real mechanism lets
    the rail proxy's role write the ledger, which the role table alone never does."""
    for table, statement in WRITES.items():
        assert not await _refused(roles_db, statement), table
    rail = as_role(roles_db, RAILPROXY)
    stmt = WRITES["paydb.balances"]
    assert await _refused(rail, stmt)
    conn = await asyncpg.connect(roles_db)
    try:
        await conn.execute(f"GRANT USAGE ON SCHEMA paydb TO {RAILPROXY}")
        await conn.execute(f"GRANT UPDATE, SELECT ON paydb.balances TO {RAILPROXY}")
        assert not await _refused(rail, stmt)  # the defence off: the bad write happens
        await apply_roles(conn)  # migrate re-applies the table: the stray grant is gone
        assert await _refused(rail, stmt)
    finally:
        await conn.close()


async def _all_tables(admin: asyncpg.Connection) -> list[str]:
    rows = await admin.fetch(
        "SELECT table_schema || '.' || table_name AS t FROM information_schema.tables"
        " WHERE table_schema = ANY($1::text[]) AND table_type = 'BASE TABLE' ORDER BY 1",
        list(db_roles.OUR_SCHEMAS),
    )
    return [r["t"] for r in rows]


@pytest.mark.parametrize("role", [RECONCILER, CHECKER])
async def test_reconciler_and_checker_cannot_write_anything(
    roles_db: str, admin: asyncpg.Connection, role: str
) -> None:
    url = as_role(roles_db, role)
    tables = await _all_tables(admin)
    assert len(tables) >= 15  # every schema's tables, schema_migrations included
    allowed: list[str] = []
    for t in tables:
        cols = await admin.fetch(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema || '.' || table_name = $1 AND is_identity = 'NO'"
            " ORDER BY ordinal_position LIMIT 1",
            t,
        )
        col = cols[0]["column_name"]
        for stmt in (
            f"INSERT INTO {t} DEFAULT VALUES",
            f"UPDATE {t} SET {col} = {col} WHERE false",
            f"DELETE FROM {t} WHERE false",
            f"TRUNCATE {t}",
        ):
            if not await _refused(url, stmt):
                allowed.append(stmt)
    for schema in (*db_roles.OUR_SCHEMAS, "public"):
        stmt = f"CREATE TABLE {schema}.roles_probe (x int)"
        if not await _refused(url, stmt):
            allowed.append(stmt)
    if not await _refused(url, "CREATE TEMP TABLE roles_probe (x int)"):
        allowed.append("CREATE TEMP TABLE")
    assert allowed == []
    # It can read every table it needs (SELECT across its schemas).
    conn = await asyncpg.connect(url)
    try:
        for t in ("paydb.payouts", "railproxy.attempts"):
            await conn.fetchval(f"SELECT count(*) FROM {t}")
        if role == CHECKER:
            await conn.fetchval("SELECT count(*) FROM lockservice.grant_history")
    finally:
        await conn.close()


async def test_a_component_role_cannot_migrate(pg_server_url: str) -> None:
    """A component starting on an unmigrated database gets a one-line error naming the admin
    command, and nothing is created."""
    url = await create_database(pg_server_url, prefix="roles_t")
    try:
        await migrate(url, schemas={"paydb"})  # roles exist; railproxy is not migrated
        with pytest.raises(MigrationError, match="payouts db migrate"):
            await migrate(as_role(url, RAILPROXY), schemas={"railproxy"})
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT to_regnamespace('railproxy')") is None
        finally:
            await conn.close()
        # Once migrated by the admin, the same start-up call is a no-op.
        await migrate(url, schemas={"railproxy"})
        assert await migrate(as_role(url, RAILPROXY), schemas={"railproxy"}) == []
    finally:
        await drop_database(pg_server_url, url)


async def test_concurrent_migrations_on_one_cluster_agree(pg_server_url: str) -> None:
    """Roles are cluster-global: migrating several fresh databases at once never fails on a
    role another migrator created a moment earlier, and each database gets its own grants."""
    urls = [await create_database(pg_server_url, prefix="roles_t") for _ in range(3)]
    try:
        await asyncio.gather(*(migrate(u, passwords={PAYDB: "p1"}) for u in urls))
        for u in urls:
            assert await _refused(as_role(u, RECONCILER), WRITES["paydb.balances"])
            assert not await _refused(as_role(u, PAYDB), WRITES["paydb.balances"])
    finally:
        for u in urls:
            await drop_database(pg_server_url, u)


async def test_passwords_come_from_configuration(roles_db: str, tmp_path: Path) -> None:
    """`DB_ROLE_PASSWORDS_DIR` files set the role's password (ALTER ROLE from configuration);
    a file readable by others or an unknown role is a clear error."""
    folder = tmp_path
    (folder / CHECKER).write_text("s3cret-from-config\n")
    (folder / CHECKER).chmod(0o644)
    with pytest.raises(RoleConfigError, match="chmod 600"):
        read_passwords(folder)
    (folder / CHECKER).chmod(0o600)
    assert read_passwords(folder) == {CHECKER: "s3cret-from-config"}
    conn = await asyncpg.connect(roles_db)
    try:
        with pytest.raises(RoleConfigError, match="unknown roles"):
            await apply_roles(conn, {"payouts_nobody": "x"})
        await apply_roles(conn, read_passwords(folder))
        stored = await conn.fetchval(
            "SELECT rolpassword FROM pg_authid WHERE rolname = $1", CHECKER
        )
        assert stored is not None and stored.startswith("SCRAM-SHA-256$")
    finally:
        await conn.close()


def test_db_migrate_command_reads_the_password_directory(
    roles_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`payouts db migrate --role-passwords DIR`: a too-open file is one clear error before
    anything is applied; a 0600 file sets that role's password."""
    from payouts.cli import main

    secret = tmp_path / RAILPROXY
    secret.write_text("from-the-command\n")
    secret.chmod(0o640)
    argv = ["db", "migrate", "--database-url", roles_db, "--role-passwords", str(tmp_path)]
    assert main(argv) == 2  # EXIT_USAGE: a bad input, nothing applied
    assert re.match(r"^error: .*readable by others; chmod 600 it$", capsys.readouterr().err)
    secret.chmod(0o600)
    assert main(argv) == 0

    async def stored() -> object:
        conn = await asyncpg.connect(roles_db)
        try:
            return await conn.fetchval(
                "SELECT rolpassword FROM pg_authid WHERE rolname = $1", RAILPROXY
            )
        finally:
            await conn.close()

    assert str(asyncio.run(stored())).startswith("SCRAM-SHA-256$")


async def _setting(url: str, name: str, **connect: object) -> str:
    conn = await asyncpg.connect(url, **connect)
    try:
        return str(await conn.fetchval(f"SHOW {name}"))
    finally:
        await conn.close()


@pytest.mark.parametrize("role", ROLE_NAMES)
async def test_writing_roles_end_a_transaction_left_idle_past_a_lease(
    roles_db: str, role: str
) -> None:
    """Every role that writes gets `idle_in_transaction_session_timeout` = one lease in this
    database, whatever client connects as it; the read-only roles keep the server's default. A
    connection's own setting (what the worker's pool sends) overrides the role's."""
    expected = f"{db_roles.IDLE_IN_TRANSACTION_S}s" if role not in (RECONCILER, CHECKER) else "0"
    url = as_role(roles_db, role)
    assert await _setting(url, "idle_in_transaction_session_timeout") == expected
    overridden = await _setting(
        url,
        "idle_in_transaction_session_timeout",
        server_settings={"idle_in_transaction_session_timeout": "3000"},
    )
    assert overridden == "3s"


async def test_the_role_defaults_are_the_tables_after_every_migrate(roles_db: str) -> None:
    """A stray per-database default on one of our roles is reset by the next apply (as a stray
    grant is): the table is the whole truth."""
    conn = await asyncpg.connect(roles_db)
    database = await conn.fetchval("SELECT current_database()")
    try:
        await conn.execute(f'ALTER ROLE {RECONCILER} IN DATABASE "{database}" SET work_mem = 1234')
        assert await _setting(as_role(roles_db, RECONCILER), "work_mem") == "1234kB"
        await apply_roles(conn)
    finally:
        await conn.close()
    assert await _setting(as_role(roles_db, RECONCILER), "work_mem") != "1234kB"
