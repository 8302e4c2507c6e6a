"""docker-compose.yml's database on a real PostgreSQL, the migrations' role scheme: the image's
first-start script (deploy/compose/postgres-init.sh), then the migrate job's own command
(`payouts db migrate` with the superuser's DSN and DB_ROLE_PASSWORDS_DIR holding the files
deploy/gen_env.py writes), then each compose service's DSN, read from docker-compose.yml, does
its own work and is refused the others' (negative control: the admin runs every refused
statement, so the refusals are privileges, not missing tables). The server speaks TLS on its TCP
port as compose's does (here the local stack's TLS front, stack.pgtls, with a certificate for
127.0.0.1 from a test CA), so each DSN connects as written, `sslmode=verify-full` and all, with
only the host and the CA file's path replaced. tests/common/test_db_roles.py covers the role
table itself on every table; this file covers what compose wires to it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from common.db_roles import ROLE_NAMES
from lockservice.server.backends.postgres import PostgresBackend
from stack.embedded.postgres import EmbeddedPostgres, pg_bin
from stack.pki import StackPKI
from tests.deploy.conftest import ROOT, compose

#: (service, DSN variable, statement) that the service's role must be able to run ...
ALLOWED = [
    ("railproxy", "RAILPROXY_DATABASE_URL", "UPDATE railproxy.attempts SET outcome = outcome"),
    ("worker", "WORKER_DATABASE_URL", "UPDATE paydb.payouts SET state = state"),
    ("worker", "RECONCILE_DATABASE_URL", "SELECT count(*) FROM railproxy.attempts"),
    ("outbox", "OUTBOX_DATABASE_URL", "UPDATE paydb.outbox SET attempts = attempts"),
    ("reconciler", "RECONCILE_DATABASE_URL", "SELECT count(*) FROM paydb.ledger_entries"),
    ("invariants", "CHECKER_DATABASE_URL", "SELECT count(*) FROM lockservice.grant_history"),
]
#: ... and statements of other components it must be refused.
REFUSED = [
    ("lock-server", "LOCK_DATABASE_URL", "UPDATE paydb.payouts SET state = state"),
    ("railproxy", "RAILPROXY_DATABASE_URL", "SELECT count(*) FROM paydb.payouts"),
    ("railproxy", "RAILPROXY_DATABASE_URL", "UPDATE lockservice.epochs SET epoch = epoch"),
    ("worker", "WORKER_DATABASE_URL", "SELECT count(*) FROM railproxy.attempts"),
    ("worker", "WORKER_DATABASE_URL", "SELECT count(*) FROM lockservice.key_counters"),
    ("worker", "RECONCILE_DATABASE_URL", "UPDATE paydb.payouts SET state = state"),
    ("outbox", "OUTBOX_DATABASE_URL", "UPDATE paydb.payouts SET state = state"),
    ("outbox", "OUTBOX_DATABASE_URL", "UPDATE paydb.outbox SET payload = payload"),
    ("reconciler", "RECONCILE_DATABASE_URL", "DELETE FROM paydb.payouts"),
    ("reconciler", "RECONCILE_DATABASE_URL", "SELECT count(*) FROM lockservice.key_counters"),
    ("invariants", "CHECKER_DATABASE_URL", "UPDATE railproxy.attempts SET outcome = outcome"),
]


def gen_env_roles(folder: Path) -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("gen_env", ROOT / "deploy" / "gen_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_role_passwords(folder)  # type: ignore[no-any-return]


class Deployed:
    def __init__(self, server: str, admin: str, passwords: dict[str, str], ca_file: str) -> None:
        self.server, self.admin, self.passwords = server, admin, passwords
        self.ca_file = ca_file

    def dsn(self, service: str, var: str) -> str:
        """The service's DSN as docker-compose.yml writes it, with compose.env's values
        substituted (`${PAYOUTS_X_DB_PASSWORD:?...}`), the test server for `postgres:5432` and
        the test CA for the compose secret's path (`sslrootcert=/run/secrets/tls-ca`)."""
        value = str(compose()["services"][service]["environment"][var])
        env = {f"{r.upper()}_DB_PASSWORD": pw for r, pw in self.passwords.items()}
        value = re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", lambda m: env[m.group(1)], value)
        value = value.replace("sslrootcert=/run/secrets/tls-ca", f"sslrootcert={self.ca_file}")
        return value.replace("@postgres:5432/", f"@{self.server}/")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """A private server (roles are cluster-wide, so never a shared one), set up as compose does."""
    tmp = tmp_path_factory.mktemp("compose-roles")
    tls = StackPKI(tmp / "tls").postgres_tls()
    pg = EmbeddedPostgres(data_dir=tmp / "pg", fast=True, tls=tls)
    pg.start()
    try:
        url = urllib.parse.urlsplit(pg.url)
        env = {
            **os.environ,
            "POSTGRES_USER": url.username or "postgres",
            # psql (pgserver's build: no SSL) over the server's socket, as the image's init does
            "PGHOST": str(pg.socket_path.parent),
            "PGPORT": str(url.port),
            "PATH": f"{Path(pg_bin('psql')).parent}:{os.environ['PATH']}",
        }
        script = ROOT / "deploy" / "compose" / "postgres-init.sh"
        subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True)
        passwords = gen_env_roles(tmp / "db-roles")
        server = f"{url.hostname}:{url.port}"
        admin = f"postgresql://{url.username or 'postgres'}@{server}/payouts?{url.query}"
        job = {**os.environ, "DATABASE_URL": admin, "DB_ROLE_PASSWORDS_DIR": str(tmp / "db-roles")}
        for var in ("LOCK_DATABASE_URL", "PAYDB_DATABASE_URL"):
            job.pop(var, None)
        payouts = Path(sys.executable).parent / "payouts"
        done = subprocess.run(
            [str(payouts), "db", "migrate"], env=job, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "paydb/" in done.stdout
        yield Deployed(server, admin, passwords, str(tls.ca_file))
    finally:
        pg.stop(mode="immediate")


async def _runs(url: str, sql: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
        return True
    except asyncpg.InsufficientPrivilegeError:
        return False
    finally:
        await conn.close()


def test_compose_uses_only_the_migrations_roles_and_the_admin_for_migrate() -> None:
    users = {
        (name, var): str(value).split("://", 1)[1].split(":", 1)[0]
        for name, svc in compose()["services"].items()
        for var, value in (svc.get("environment") or {}).items()
        if str(value).startswith("postgresql://")
    }
    assert users.pop(("migrate", "DATABASE_URL")) == "postgres"
    assert set(users.values()) == set(ROLE_NAMES)
    for (name, var), user in users.items():  # each DSN carries its own role's password
        value = compose()["services"][name]["environment"][var]
        assert f"${{{user.upper()}_DB_PASSWORD:?" in value, (name, var)


async def test_migrate_job_creates_the_roles_with_their_passwords(deployed: Deployed) -> None:
    conn = await asyncpg.connect(deployed.admin)
    try:
        rows = await conn.fetch(
            "SELECT rolname, rolpassword IS NOT NULL AS has_pw FROM pg_authid"
            " WHERE rolcanlogin AND rolname <> current_user"
        )
    finally:
        await conn.close()
    # Only the migrations' roles log in besides the admin: the old per-deployment roles
    # (migrator, lock_server, worker, reader, ...) are gone; every one has its file's password.
    assert {r["rolname"]: r["has_pw"] for r in rows} == dict.fromkeys(ROLE_NAMES, True)


async def test_lock_server_dsn_starts_its_backend_and_grants(deployed: Deployed) -> None:
    backend = await PostgresBackend.start(deployed.dsn("lock-server", "LOCK_DATABASE_URL"))
    try:
        session = await backend.open_session(15.0)
        grant = await backend.acquire(session.session_id, "payout:acct-1", 1.0)
        assert getattr(grant, "token", 0) > 0
    finally:
        await backend.close()


@pytest.mark.parametrize(("service", "var", "sql"), ALLOWED, ids=lambda v: str(v)[:40])
async def test_each_service_dsn_does_its_own_work(
    deployed: Deployed, service: str, var: str, sql: str
) -> None:
    assert await _runs(deployed.dsn(service, var), sql)


@pytest.mark.parametrize(("service", "var", "sql"), REFUSED, ids=lambda v: str(v)[:40])
async def test_each_service_dsn_is_refused_the_others_work(
    deployed: Deployed, service: str, var: str, sql: str
) -> None:
    assert not await _runs(deployed.dsn(service, var), sql)
    # Negative control: the same statement as the admin runs, so the refusal is the role's.
    assert await _runs(deployed.admin, sql)
