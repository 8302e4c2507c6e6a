"""One PostgreSQL login role per component, with only the privileges its code uses (NFR-13).

Owns: the role table (name, component, grants), applying it to one database after its
migrations (`common.migrate.migrate` calls `apply_roles` with the admin DSN), revoking PUBLIC's
defaults on our schemas, and building a role's DSN from the admin one. Must never: hold a
password in source (they come from configuration: `DB_ROLE_PASSWORDS_DIR`, or the stack's
generated files under `.run/`), grant a role anything its component does not run, or give the
reconciler or the invariant checker any write.

Roles are cluster-global in PostgreSQL, grants are per database: creation tolerates a role that
exists already (another database of the same cluster, or a concurrent migrator, created it), and
every grant is re-applied on each migrate (REVOKE ALL, then GRANT), so a narrowed table narrows
the database too. The `payouts_` prefix keeps our roles apart from anything else on a shared
cluster.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

LOCKSERVICE = "payouts_lockservice"
RAILPROXY = "payouts_railproxy"
PAYDB = "payouts_paydb"
OUTBOX = "payouts_outbox"
RECONCILER = "payouts_reconciler"
CHECKER = "payouts_checker"

#: How long a session of a writing role may sit idle inside a transaction before PostgreSQL ends
#: it (rolling the transaction back): about one lease (A-04's 15 s session TTL). Why: a holder
#: frozen between its UPDATEs and its COMMIT (a SIGSTOP, a stop-the-world pause, a partition)
#: keeps the payout's, the account's and the shared rail_clearing balance rows locked for as
#: long as it is frozen; every other payout's post queues behind rail_clearing. Ending the
#: transaction fails closed: its writes never commit, and the next holder, under a newer grant,
#: proceeds. A holder that legitimately waits is not idle (it waits inside a statement), and no
#: code of ours waits on anything else inside a transaction. Processes that know their own lease
#: set a shorter value on their connections (worker/process.py: its lock TTL), which overrides this.
IDLE_IN_TRANSACTION_S = 15
_WRITER_SETTINGS = (("idle_in_transaction_session_timeout", f"{IDLE_IN_TRANSACTION_S}s"),)

#: Every column of paydb.outbox the publisher and the outbox operator commands update.
_OUTBOX_UPDATED = (
    "status, attempts, next_retry_at, claimed_by, claimed_until, last_outcome, last_error,"
    " delivered_at, published_at"
)


@dataclass(frozen=True)
class Role:
    name: str
    component: str
    #: (schema, privileges, table or "*" for every table of the schema). Privileges may name
    #: columns, e.g. "UPDATE (status)".
    grants: tuple[tuple[str, str, str], ...]
    #: Schemas whose sequences it may use (bigserial ids), and how: "USAGE" (nextval), plus
    #: "SELECT" where the code reads a sequence's last_value.
    sequences: tuple[tuple[str, str], ...] = ()
    functions: tuple[str, ...] = ()  # schemas whose functions it may call
    #: Session defaults set for the role in each database it is granted (`ALTER ROLE .. IN
    #: DATABASE .. SET`), applied whatever DSN or client connects as it.
    settings: tuple[tuple[str, str], ...] = ()


ROLES: tuple[Role, ...] = (
    Role(
        LOCKSERVICE,
        "lock server (postgres backend)",
        (
            ("lockservice", "SELECT, INSERT, UPDATE, DELETE", "sessions"),
            ("lockservice", "SELECT, INSERT, UPDATE, DELETE", "holders"),
            ("lockservice", "SELECT, INSERT, UPDATE, DELETE", "waiters"),
            ("lockservice", "SELECT, INSERT, UPDATE", "key_counters"),
            ("lockservice", "SELECT, INSERT, UPDATE", "epochs"),
            ("lockservice", "SELECT, INSERT, UPDATE", "grant_history"),
            ("lockservice", "SELECT, INSERT", "audit"),
            ("lockservice", "SELECT", "schema_migrations"),
        ),
        sequences=(("lockservice", "USAGE, SELECT"),),  # SELECT: grant_history_id_seq read
        functions=("lockservice",),
        settings=_WRITER_SETTINGS,  # a frozen lock server holds the key counter's row lock
    ),
    Role(
        RAILPROXY,
        "rail proxy",
        (
            ("railproxy", "SELECT, INSERT, UPDATE", "account_fences"),
            ("railproxy", "SELECT, INSERT, UPDATE", "attempts"),
            ("railproxy", "SELECT, INSERT, UPDATE", "budget_slots"),  # the shared budget
            ("railproxy", "SELECT", "schema_migrations"),
        ),
        sequences=(("railproxy", "USAGE"),),
        settings=_WRITER_SETTINGS,
    ),
    Role(
        PAYDB,
        "workers (payment store), `payouts seed` and `payouts payout ...`",
        (
            ("paydb", "SELECT, INSERT", "accounts"),
            ("paydb", "SELECT, INSERT, UPDATE", "balances"),
            ("paydb", "SELECT, INSERT, UPDATE", "payouts"),
            ("paydb", "SELECT", "payout_transitions"),  # read by the payouts_guard trigger
            ("paydb", "SELECT, INSERT", "ledger_groups"),
            ("paydb", "SELECT, INSERT", "ledger_entries"),
            ("paydb", "SELECT, INSERT", "audit_log"),
            ("paydb", "INSERT", "outbox"),
            ("paydb", "SELECT, INSERT, UPDATE", "operator_commands"),
        ),
        sequences=(("paydb", "USAGE"),),
        settings=_WRITER_SETTINGS,
    ),
    Role(
        OUTBOX,
        "outbox publisher and `payouts outbox ...`",
        (
            ("paydb", f"SELECT, UPDATE ({_OUTBOX_UPDATED})", "outbox"),
            ("paydb", "INSERT", "audit_log"),  # operator retry/discard is audited
        ),
        sequences=(("paydb", "USAGE"),),
        settings=_WRITER_SETTINGS,
    ),
    Role(
        RECONCILER,
        "reconciler (`payouts reconcile`, ReconcileWorkflow's activity)",
        (("paydb", "SELECT", "*"), ("railproxy", "SELECT", "*")),
    ),
    Role(
        CHECKER,
        "invariant checker (`payouts check-invariants`)",
        (("paydb", "SELECT", "*"), ("railproxy", "SELECT", "*"), ("lockservice", "SELECT", "*")),
    ),
)

ROLE_NAMES = tuple(r.name for r in ROLES)
OUR_SCHEMAS = ("lockservice", "paydb", "railproxy")


class RoleConfigError(ValueError):
    """Bad role configuration (an unreadable or too open password file, an unknown role)."""


#: The per-component DSN variables and the role each one names (docs/database-roles.md).
DSN_VARS: dict[str, str] = {
    "LOCK_DATABASE_URL": LOCKSERVICE,
    "RAILPROXY_DATABASE_URL": RAILPROXY,
    "WORKER_DATABASE_URL": PAYDB,
    "PAYDB_DATABASE_URL": PAYDB,
    "OUTBOX_DATABASE_URL": OUTBOX,
    "RECONCILE_DATABASE_URL": RECONCILER,
    "CHECKER_DATABASE_URL": CHECKER,
}


def role_url(admin_url: str, role: str, password: str | None = None) -> str:
    """The admin DSN's server and database, as `role`. Without `password` (what is printed or
    handed to a process) the password comes from a PGPASSFILE or the server's trust rules;
    with it, the URL is for in-process use only and must never be logged."""
    parts = urlsplit(admin_url)
    hosts = parts.netloc.rpartition("@")[2]  # as written: [v6]:port, or a multi-host list
    user = quote(role) + (f":{quote(password, safe='')}" if password else "")
    netloc = f"{user}@{hosts}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def read_passwords(folder: Path) -> dict[str, str]:
    """One file per role, named after it, holding its password; each must be 0600 or tighter."""
    if not folder.is_dir():
        raise RoleConfigError(f"role password directory {folder} does not exist")
    out: dict[str, str] = {}
    for name in ROLE_NAMES:
        path = folder / name
        if not path.exists():
            continue
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RoleConfigError(f"{path} is readable by others; chmod 600 it")
        password = path.read_text().strip()
        if not password:
            raise RoleConfigError(f"{path} is empty")
        out[name] = password
    return out


async def _create_role(conn: asyncpg.Connection, role: str) -> None:
    # A concurrent CREATE ROLE on another database of the cluster raises unique_violation on
    # pg_authid rather than duplicate_object: both mean the role is there.
    await conn.execute(
        "DO $$ BEGIN"
        f" CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;"
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;"
        " END $$"
    )


async def _retry_concurrent(conn: asyncpg.Connection, sql: str) -> None:
    """ALTER ROLE from two migrators at once can fail with 'tuple concurrently updated'."""
    for attempt in range(10):
        try:
            await conn.execute(sql)
            return
        except asyncpg.InternalServerError as exc:
            if "concurrently" not in str(exc) or attempt == 9:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))


async def _set_password(conn: asyncpg.Connection, role: str, password: str) -> None:
    literal = await conn.fetchval("SELECT quote_literal($1)", password)
    await _retry_concurrent(conn, f"ALTER ROLE {role} LOGIN PASSWORD {literal}")


async def _existing(conn: asyncpg.Connection, schemas: tuple[str, ...]) -> dict[str, set[str]]:
    rows = await conn.fetch(
        "SELECT table_schema, table_name FROM information_schema.tables"
        " WHERE table_schema = ANY($1::text[])",
        list(schemas),
    )
    out: dict[str, set[str]] = {s: set() for s in schemas}
    for r in rows:
        out[r["table_schema"]].add(r["table_name"])
    present = await conn.fetch(
        "SELECT nspname FROM pg_namespace WHERE nspname = ANY($1::text[])", list(schemas)
    )
    return {s: out[s] for s in {r["nspname"] for r in present}}


async def _grant_role(conn: asyncpg.Connection, role: Role, tables: dict[str, set[str]]) -> None:
    for schema in tables:
        await conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role.name}")
        await conn.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role.name}")
        await conn.execute(f"REVOKE ALL ON SCHEMA {schema} FROM {role.name}")
    for schema, privileges, table in role.grants:
        if schema not in tables:
            continue  # a partial migration (tests migrate one schema): granted when it exists
        await conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role.name}")
        if table == "*":
            target = f"ALL TABLES IN SCHEMA {schema}"
        elif table in tables[schema]:
            target = f"{schema}.{table}"
        else:
            continue
        await conn.execute(f"GRANT {privileges} ON {target} TO {role.name}")
    for schema, privileges in role.sequences:
        if schema in tables:
            await conn.execute(
                f"GRANT {privileges} ON ALL SEQUENCES IN SCHEMA {schema} TO {role.name}"
            )
    for schema in role.functions:
        if schema in tables:
            await conn.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role.name}")


async def _set_defaults(conn: asyncpg.Connection, role: Role, database: str) -> None:
    """The role's session defaults in this database, exactly the table's (reset, then set)."""
    await conn.execute(f"ALTER ROLE {role.name} IN DATABASE {database} RESET ALL")
    for name, value in role.settings:
        literal = await conn.fetchval("SELECT quote_literal($1)", value)
        await conn.execute(f"ALTER ROLE {role.name} IN DATABASE {database} SET {name} = {literal}")


async def apply_roles(conn: asyncpg.Connection, passwords: Mapping[str, str] | None = None) -> None:
    """Create the roles (if missing), set the configured passwords, and make this database's
    grants exactly the role table. Run with the admin DSN (superuser or CREATEROLE + owner)."""
    passwords = passwords or {}
    unknown = set(passwords) - set(ROLE_NAMES)
    if unknown:
        raise RoleConfigError(f"passwords for unknown roles: {sorted(unknown)}")
    for role in ROLES:
        await _create_role(conn, role.name)
        if role.name in passwords:
            await _set_password(conn, role.name, passwords[role.name])
    database = await conn.fetchval("SELECT quote_ident(current_database())")
    async with conn.transaction():
        # Per database: one migrator at a time (the lock is scoped to this database).
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('payouts:db_roles'))")
        tables = await _existing(conn, OUR_SCHEMAS)
        # PUBLIC's defaults: no CREATE in schema public, no temporary tables, nothing on our
        # schemas, no EXECUTE on our functions (PostgreSQL grants that to PUBLIC on creation).
        await conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        await conn.execute(f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC")
        for schema in tables:
            await conn.execute(f"REVOKE ALL ON SCHEMA {schema} FROM PUBLIC")
            await conn.execute(f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC")
        for role in ROLES:
            await conn.execute(f"GRANT CONNECT ON DATABASE {database} TO {role.name}")
            await _grant_role(conn, role, tables)
            await _set_defaults(conn, role, database)


#: Which roles each stack process connects as (its PGPASSFILE holds exactly these).
PROCESS_ROLES: dict[str, tuple[str, ...]] = {
    "lock": (LOCKSERVICE,),
    "railproxy": (RAILPROXY,),
    "outbox": (OUTBOX,),
    "worker": (PAYDB, RECONCILER),
    "all": ROLE_NAMES,  # for the operator's shell (`payouts up` exports it)
}


@dataclass(frozen=True)
class RoleFiles:
    """The stack's generated role passwords under `<run dir>/db-roles/` (0700, files 0600)."""

    folder: Path
    passwords: dict[str, str]

    def pgpass(self, process: str) -> Path:
        return self.folder / f"{process}.pgpass"


def generate_role_files(folder: Path) -> RoleFiles:
    """One random password per role (kept for the next start), and one libpq password file per
    process naming only the roles it uses. Never printed, never logged."""
    import secrets

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    passwords: dict[str, str] = {}
    for name in ROLE_NAMES:
        path = folder / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24) + "\n")  # [A-Za-z0-9_-]: no pgpass escaping
    passwords = read_passwords(folder)
    files = RoleFiles(folder, passwords)
    for process, roles in PROCESS_ROLES.items():
        path = files.pgpass(process)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"*:*:*:{role}:{passwords[role]}\n" for role in roles)
    return files
