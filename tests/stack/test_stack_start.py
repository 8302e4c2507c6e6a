"""The real local stack on its default backend, started through the Python API: every service
healthy and answering, each process on its own credentials and database role, restarts kept
healthy, every process's metrics free of identifiers, and nothing left behind after exit or a
failed start."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from common import db_roles
from common.stackmark import database_mark, temporal_mark
from lab.experiments.evidence import json_events
from payouts.batch import PayoutSpec
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.cli import exports
from stack.config import ServiceFailedError, StackConfig
from stack.endpoints import endpoints
from stack.envfile import read_env_file
from stack.services import worker_available
from stack.system import Stack
from tests.jsonlogs import assert_every_line_json, service_logs
from tests.stack.conftest import ID_LABELS, acquire_token, assert_all_gone, metrics_endpoints
from workflows.reconcile_schedule import SCHEDULE_ID


async def _assert_credentials(stack: Stack) -> None:
    """docs/architecture.md, Trust: every token file is 0600 under the run dir and reaches only its own
    process; the lock server refuses an unauthenticated acquire and a worker's bump-epoch."""
    creds = stack.credentials
    for name, path in {**creds.tokens, **creds.servers}.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
    owners = {"worker": "worker-", "railproxy": "railproxy", "outbox": "outbox"}
    for identity, path in creds.tokens.items():
        holders = {n for n, p in stack.launcher.procs.items() if str(path) in p.env.values()}
        prefix = owners.get(identity)
        if identity == "reconciler":  # the hourly reconcile Schedule runs in the workers
            assert holders and all(n.startswith("worker") for n in holders), holders
        elif prefix is None:  # the operator's and the checker's: no child process holds them
            assert holders == set(), (identity, holders)
        else:
            assert holders and all(n.startswith(prefix) for n in holders), (identity, holders)
    async with httpx.AsyncClient(base_url=stack.lock_url, timeout=10) as http:
        assert (await http.post("/v1/sessions", json={})).status_code == 401
        worker = {"Authorization": f"Bearer {stack.token('worker')}"}
        bump = {"min_epoch": 1, "reason": "test"}
        assert (await http.post("/v1/epoch/bump", json=bump, headers=worker)).status_code == 403
    async with httpx.AsyncClient(base_url=stack.railstub_url, timeout=10) as http:
        assert (await http.get("/admin/movements")).status_code == 401
        r = await http.get("/admin/movements", headers=stack.operator_headers())
        assert r.status_code == 200


def _assert_private_key_only_at_the_lock_server(stack: Stack, stack_dir: Path) -> None:
    """INV-07: the generated private key (0600, under the run dir) reaches only the lock server;
    the proxy and the workers get the public directory."""
    private = Path(stack.launcher.procs["lock-server"].env["LOCK_SIGNING_KEY_PATH"])
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.resolve().is_relative_to(stack_dir.resolve())
    for name, proc in stack.launcher.procs.items():
        if name != "lock-server":
            assert str(private) not in proc.env.values(), name
    public = stack.launcher.procs["railproxy"].env["RAILPROXY_GRANT_PUBLIC_KEYS"]
    assert (Path(public) / private.name).exists()


#: Which role each process's DSN variables name (docs/database-roles.md).
_PROCESS_DSNS = {
    "lock-server": {"LOCK_DATABASE_URL": db_roles.LOCKSERVICE},
    "railproxy": {"RAILPROXY_DATABASE_URL": db_roles.RAILPROXY},
    "outbox": {"OUTBOX_DATABASE_URL": db_roles.OUTBOX},
    "worker": {
        "WORKER_DATABASE_URL": db_roles.PAYDB,
        "RECONCILE_DATABASE_URL": db_roles.RECONCILER,
    },
}


def _assert_every_process_on_its_own_role(stack: Stack, stack_dir: Path) -> set[str]:
    """NFR-13: no child gets the admin DSN; each one's DSN names its own role, its password
    file (0600, under the run dir) holds only its roles' lines, and PostgreSQL really sees a
    session of every role (`_assert_role_sessions`); the passwords are never printed. Returns
    the roles that must have a session open."""
    expected_sessions: set[str] = set()
    for name, proc in stack.launcher.procs.items():
        assert "DATABASE_URL" not in proc.env, name
        assert stack.database_url not in proc.env.values(), name
        own = _PROCESS_DSNS.get("worker" if name in stack.workers else name)
        if own is None:
            assert not [k for k in proc.env if k.endswith("DATABASE_URL")], name
            continue
        for var, role in own.items():
            assert urlsplit(proc.env[var]).username == role, (name, var)
            assert urlsplit(proc.env[var]).password is None, (name, var)
        pgpass = Path(proc.env["PGPASSFILE"])
        assert pgpass.resolve().is_relative_to(stack_dir.resolve())
        assert stat.S_IMODE(pgpass.stat().st_mode) == 0o600
        assert {line.split(":")[3] for line in pgpass.read_text().splitlines()} == set(own.values())
        expected_sessions |= {r for r in own.values() if r != db_roles.RECONCILER}
    folder = stack_dir / "db-roles"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    exported = exports(stack)
    for var in db_roles.DSN_VARS:
        assert f"export {var}=" in exported
    for role in db_roles.ROLE_NAMES:
        assert stat.S_IMODE((folder / role).stat().st_mode) == 0o600
        assert (folder / role).read_text().strip() not in exported
    return expected_sessions


async def _assert_role_sessions(stack: Stack, expected_sessions: set[str]) -> None:
    """PostgreSQL sees a session of every process role, and every role has a password."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        sessions = {
            r["usename"]
            for r in await conn.fetch(
                "SELECT usename FROM pg_stat_activity WHERE datname = current_database()"
            )
        }
        assert expected_sessions <= sessions
        without = await conn.fetch(
            "SELECT rolname FROM pg_authid WHERE rolname = ANY($1::text[]) AND rolpassword IS NULL",
            list(db_roles.ROLE_NAMES),
        )
        assert without == []
    finally:
        await conn.close()


@pytest.mark.slow
async def test_stack_starts_every_service_and_leaves_nothing_behind(
    stack_env: dict[str, str], stack_dir: Path, external_database_url: str | None
) -> None:
    """Every service answers on its address, a restart keeps it healthy, and exit kills all pids."""
    workers = 1 if worker_available() else 0
    config = StackConfig.from_env(
        stack_env, run_dir=stack_dir, workers=workers, database_url=external_database_url
    )
    seen: dict[str, int] = {}
    async with Stack(config) as stack:
        logs = service_logs(stack)
        if external_database_url is not None:
            assert stack.database_url == external_database_url
            assert "postgres" not in stack.processes
        else:
            assert "postgres" in stack.processes
        assert {"temporal", "lock-server", "railstub", "railproxy"} <= set(stack.processes)
        assert len(stack.workers) == workers
        seen.update({name: info.pid for name, info in stack.processes.items()})

        conn = await asyncpg.connect(stack.database_url)
        try:
            applied = await conn.fetchval("SELECT count(*) FROM paydb.schema_migrations")
            in_database = await database_mark(conn)
        finally:
            await conn.close()
        assert applied >= 1

        client = await Client.connect(stack.temporal_address)
        assert await client.service_client.check_health()
        # One stack id in its database and its Temporal: a CLI can tell they belong together.
        assert len(stack.stack_id) == 12
        assert in_database == await temporal_mark(client) == stack.stack_id
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(stack.ui_url)).status_code == 200
            assert (await http.get(f"{stack.railstub_url}/health")).json() == {"status": "ok"}
            proxy = (await http.get(f"{stack.railproxy_url}/health")).json()
            assert proxy["fencing_enforced"] is True
            assert proxy["submission_guard_enforced"] is True
        assert await acquire_token(stack, "stack-test:a") > 0
        await _assert_what_compose_runs(stack, client)
        _assert_env_file(stack)
        _assert_private_key_only_at_the_lock_server(stack, stack_dir)
        await _assert_credentials(stack)
        await _assert_role_sessions(stack, _assert_every_process_on_its_own_role(stack, stack_dir))

        old_pid = stack.processes["lock-server"].pid
        await stack.restart("lock-server")
        new_pid = stack.processes["lock-server"].pid
        seen["lock-server-old"] = old_pid
        seen["lock-server"] = new_pid
        assert new_pid != old_pid
        assert await acquire_token(stack, "stack-test:b") > 0

        if external_database_url is None:
            seen["postgres-old"] = stack.processes["postgres"].pid
            await stack.restart("postgres")
            seen["postgres"] = stack.processes["postgres"].pid
            conn = await asyncpg.connect(stack.database_url)
            try:
                assert await conn.fetchval("SELECT count(*) FROM paydb.schema_migrations") >= 1
            finally:
                await conn.close()

        if workers:
            await _one_payout_then_scrape_every_process(stack)
            extra = await stack.start_worker()
            seen[extra.name] = extra.pid or 0
            assert extra.name in stack.processes
            logs |= service_logs(stack)
            await stack.stop_worker(extra.name)
            assert extra.name not in stack.processes

        state = json.loads((stack_dir / "stack.json").read_text())
        assert state["processes"]["lock-server"]["pid"] == new_pid
        _assert_env_file(stack)  # rewritten after the restarts and the extra worker
    assert not stack.env_file.exists()  # a stopped stack leaves no addresses to source
    assert_all_gone(seen)
    # Issue 28 §5: after starts, a restart, a payout and the stops, every line jq can read.
    assert_every_line_json(logs)
    assert not Stack(config).processes


async def _assert_what_compose_runs(stack: Stack, client: Client) -> None:
    """As compose's jobs do: the reconcile-hourly Schedule exists (scheduled reconciliation in
    the workers), and the lock server keeps its watermark under RUN/lock-state (restore
    detection on: its first event is the baseline, never lock.restore_detection_off)."""
    description = await client.get_schedule_handle(SCHEDULE_ID).describe()
    assert description.schedule.spec.intervals[0].every == timedelta(hours=1)
    assert list((stack.run_dir / "lock-state").glob("watermark-*.json"))
    events = [e["event"] for e in json_events(stack.processes["lock-server"].log_path)]
    assert "lock.watermark_baseline" in events and "lock.restore_detection_off" not in events


def _assert_env_file(stack: Stack) -> None:
    """RUN/stack.env holds every address, and each metrics endpoint the stack serves."""
    env = read_env_file(stack.env_file)
    assert stat.S_IMODE(stack.env_file.stat().st_mode) == 0o600
    assert env["LOCK_URL"] == stack.lock_url and env["RAILPROXY_URL"] == stack.railproxy_url
    assert env["TEMPORAL_ADDRESS"] == stack.temporal_address
    assert env["RAILSTUB_URL"] == stack.railstub_url
    if stack.finledger_url:
        assert env["FINLEDGER_URL"] == stack.finledger_url
    assert Path(env["PAYOUTS_OPERATOR_TOKEN_FILE"]).exists()
    urls = {e.url for e in endpoints(stack)}
    listed = {env["OUTBOX_METRICS_URL"], env["TEMPORAL_METRICS_URL"]}
    listed |= set(env["WORKER_URLS"].split()) | set(env["WORKER_SDK_METRICS_URLS"].split())
    assert listed <= urls and len(env["WORKER_URLS"].split()) == len(stack.workers)
    assert stack.database_url not in {v for k, v in env.items() if k != "DATABASE_URL"}
    # The runbooks' `curl "$LOCK_URL/health"` verifies the https server with the env file's
    # variables alone (Debian's curl reads CURL_CA_BUNDLE; it ignores SSL_CERT_FILE).
    clean = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "CURL_CA_BUNDLE")}
    done = subprocess.run(  # the timeout is a failure detector's bound, not a timing assertion
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"{env['LOCK_URL']}/health"],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "200"), done.stderr


async def _one_payout_then_scrape_every_process(stack: Stack) -> None:
    """One payout through the whole stack, then every process's metrics are scraped: each answers,
    and no label, by name or by value, carries the payout's, the account's or the lock's id."""
    prefix = f"scrape{uuid.uuid4().hex[:6]}-"
    paydb = stack.role_dsn("PAYDB_DATABASE_URL")  # as an operator's shell would, on its role
    accounts = await seed_accounts(paydb, 1, 10_000, prefix)
    spec = PayoutSpec(f"{prefix}p", accounts[0], 100)
    await create_payouts(paydb, [spec])
    await start_workflows(stack.temporal_address, stack.config.task_queue, [spec])
    conn = await asyncpg.connect(stack.database_url)
    try:
        for _ in range(300):
            state = await conn.fetchval(
                "SELECT state FROM paydb.payouts WHERE payout_id = $1", spec.payout_id
            )
            if state == "POSTED":
                break
            await asyncio.sleep(0.2)
        assert state == "POSTED"
    finally:
        await conn.close()
    secrets = {spec.payout_id, spec.account_id, f"payout:{spec.account_id}"}
    async with httpx.AsyncClient(timeout=10) as http:
        for name, url in metrics_endpoints(stack).items():
            response = await http.get(url)
            assert response.status_code == 200, (name, url)
            families = list(text_string_to_metric_families(response.text))
            assert families, (name, "no metrics")
            for family in families:
                for sample in family.samples:
                    assert not ID_LABELS & set(sample.labels), (name, sample)
                    assert not secrets & set(sample.labels.values()), (name, sample)


async def test_failed_start_stops_what_already_started(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    """A service that dies at start-up fails with its name and log, and nothing stays running."""
    config = StackConfig.from_env(
        stack_env,
        run_dir=stack_dir,
        workers=0,
        health_timeout_s=20,
        # An invalid setting makes the rail stub exit at start-up.
        service_env={"railstub": {"RAILSTUB_PORT": "not-a-port"}},
    )
    stack = Stack(config)
    started: dict[str, int] = {}

    async def watch() -> None:
        while True:
            started.update({n: i.pid for n, i in stack.processes.items()})
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        with pytest.raises(
            ServiceFailedError, match=r"railstub exited with code \d+.*railstub\.log"
        ):
            await stack.start()
    finally:
        watcher.cancel()
    assert {"temporal", "lock-server"} <= set(started)
    assert_all_gone(started)
