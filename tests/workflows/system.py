"""The real system for workflow integration tests: the lock server, the rail stub and the rail
proxy as real processes (their own `python -m` entry points), PostgreSQL, the Temporal dev
server, and workers running the real activities, in-process or as `worker_main.py` processes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities import models as m
from activities.payout_activities import PayoutActivities
from common import db_roles
from ledger import PayoutStore
from ledger import WorkContext as LedgerContext
from lockservice.sdk import LockClient
from railproxy.client import RailProxyClient
from stack.embedded.shared import free_port
from tests import waiting
from tests.conftest import as_role
from tests.credentials import headers, server_env, token
from tests.grants import grant_verifier, lock_server_env, public_keys
from workflows.payout import PayoutWorkflow

ROOT = Path(__file__).resolve().parents[2]


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} not healthy within {timeout_s}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class System:
    database_url: str
    lock_url: str
    stub_url: str
    proxy_url: str
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # name -> (args, env, health URL): how each process was started, to restart it the same way
    specs: dict[str, tuple[list[str], dict[str, str], str]] = field(default_factory=dict)

    # ------------------------------------------------------------------ outages
    def stop_service(self, name: str) -> None:
        """Stop one process (lock, stub, proxy): a real outage, its port left dead."""
        stop(self.procs[name])

    def start_service(self, name: str) -> None:
        """Start a stopped process again, on the same port and settings, and wait for health."""
        args, env, health = self.specs[name]
        log = self.log_dir / f"{name}.log"
        self.procs[name] = spawn(args, env, log)
        wait_healthy(health, self.procs[name], log)

    # ------------------------------------------------------------------ rail stub admin
    def stub_set(self, **behaviour: Any) -> None:
        httpx.post(
            f"{self.stub_url}/admin/behaviour", json=behaviour, timeout=5, headers=headers()
        ).raise_for_status()

    def stub_reset(self) -> None:
        httpx.post(f"{self.stub_url}/admin/reset", timeout=5, headers=headers()).raise_for_status()

    def movements(self, client_reference: str) -> list[dict[str, Any]]:
        r = httpx.get(
            f"{self.stub_url}/admin/movements",
            params={"client_reference": client_reference},
            timeout=5,
            headers=headers(),
        )
        r.raise_for_status()
        data = r.json()
        rows: list[dict[str, Any]] = data["movements"] if isinstance(data, dict) else data
        return [m for m in rows if m["client_reference"] == client_reference]


@contextlib.contextmanager
def running_system(
    database_url: str, log_dir: Path, env: Mapping[str, Mapping[str, str]] | None = None
) -> Iterator[System]:
    """`env` adds to (or overrides) a service's environment, by name: "lock", "stub", "proxy"."""
    log_dir.mkdir(parents=True, exist_ok=True)
    extra = env or {}
    ports = {name: free_port() for name in ("lock", "stub", "proxy")}
    sys_ = System(
        database_url=database_url,
        lock_url=f"http://127.0.0.1:{ports['lock']}",
        stub_url=f"http://127.0.0.1:{ports['stub']}",
        proxy_url=f"http://127.0.0.1:{ports['proxy']}",
        log_dir=log_dir,
    )
    specs = [
        (
            "lock",
            ["-m", "lockservice", "serve"],
            {
                "LOCK_BACKEND": "postgres",
                "LOCK_DATABASE_URL": as_role(database_url, db_roles.LOCKSERVICE),  # its own role
                "LOCK_PORT": str(ports["lock"]),
                **lock_server_env(),  # signs every grant with the test key
                **server_env("lock-server"),  # and authenticates its callers
            },
            f"{sys_.lock_url}/health",
        ),
        (
            "stub",
            ["-m", "railstub"],
            {
                "RAILSTUB_PORT": str(ports["stub"]),
                "RAILSTUB_LATENCY_MODE": "fixed",
                "RAILSTUB_LATENCY_FIXED_MS": "5",
                "RAILSTUB_AMBIGUITY_RATE": "0",
                "RAILSTUB_STALL_S": "4",
                # Durable, like a real rail's records (a restarted stub keeps its evidence).
                "RAILSTUB_MOVEMENTS_PATH": str(log_dir / "movements.sqlite"),
                **server_env("railstub"),
            },
            f"{sys_.stub_url}/health",
        ),
        (
            "proxy",
            ["-m", "railproxy"],
            {
                "RAILPROXY_DATABASE_URL": as_role(database_url, db_roles.RAILPROXY),
                "RAILPROXY_RAIL_URL": sys_.stub_url,
                "RAILPROXY_PORT": str(ports["proxy"]),
                "RAILPROXY_RAIL_TIMEOUT_S": "3",
                "RAILPROXY_GRANT_PUBLIC_KEYS": public_keys(),
                # One host, one clock, a loopback connection: the test rail has no skew and
                # ingests at once, so small margins keep "absent" proofs within a test's time.
                # (test_slow_rail runs with the shipped defaults and with both at 0.)
                "RAILPROXY_ABSENCE_INGEST_BOUND_S": "1",
                "RAILPROXY_ABSENCE_CLOCK_SKEW_MARGIN_S": "0.5",
                **server_env("railproxy"),
            },
            f"{sys_.proxy_url}/health",
        ),
    ]
    try:
        for name, args, own, health in specs:
            sys_.specs[name] = (args, {**own, **extra.get(name, {})}, health)
            sys_.start_service(name)
        yield sys_
    finally:
        for proc in sys_.procs.values():
            stop(proc)


@dataclass
class InProcessWorker:
    """The real activities in this process, with their own lock session and holder queue."""

    name: str
    acts: PayoutActivities
    locks: LockClient


@contextlib.asynccontextmanager
async def in_process_workers(
    client: Client,
    system: System,
    shared_queue: str,
    count: int = 1,
    *,
    ttl_s: float = 3.0,
    database_url: str | None = None,
    proxy_url: str | None = None,
    verify_assertions: bool = True,
) -> AsyncIterator[list[InProcessWorker]]:
    """Workers running the real activities. `database_url` / `proxy_url` point them elsewhere
    (e.g. at a dead port: workers that are up but cannot reach their database or the proxy).
    `verify_assertions=False` is WORKER_VERIFY_OPERATOR_ASSERTIONS=false (negative control)."""
    # min_size=0: a pool at a dead port is created empty and fails each acquire, like a worker
    # whose database is unreachable.
    # The payment store's own role, as the worker connects (WORKER_DATABASE_URL).
    pool = await asyncpg.create_pool(
        database_url or as_role(system.database_url, db_roles.PAYDB),
        min_size=0 if database_url else 1,
        max_size=10,
    )
    # As worker/process.py builds it: every fenced write verifies the lock server's signed grant.
    store = PayoutStore(pool, verifier=grant_verifier(), verify_assertions=verify_assertions)
    workers: list[InProcessWorker] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for i in range(count):
                locks = await stack.enter_async_context(
                    LockClient(
                        system.lock_url, ttl_s=ttl_s, heartbeat_s=ttl_s / 4, token=token("worker")
                    )
                )
                proxy = await stack.enter_async_context(
                    RailProxyClient(proxy_url or system.proxy_url, token=token("worker"))
                )
                name = f"w{i}-{uuid.uuid4().hex[:6]}"
                holder_queue = f"{shared_queue}-holder-{name}"
                # One client per simulated worker process: Temporal allows one worker per task
                # queue per client, as it would per process.
                own = await Client.connect(
                    client.service_client.config.target_host, namespace=client.namespace
                )
                acts = PayoutActivities(
                    locks=locks,
                    store=store,
                    proxy=proxy,
                    worker_queue=holder_queue,
                    worker_id=name,
                    lock_url=system.lock_url,
                    token=token("worker"),
                    temporal=own,  # as worker/process.py: grants are handed over by the activities
                )
                await stack.enter_async_context(
                    Worker(
                        own,
                        task_queue=shared_queue,
                        workflows=[PayoutWorkflow],
                        activities=acts.shared_queue_activities(),
                    )
                )
                await stack.enter_async_context(
                    Worker(own, task_queue=holder_queue, activities=acts.holder_queue_activities())
                )
                workers.append(InProcessWorker(name=name, acts=acts, locks=locks))
            yield workers
    finally:
        for worker in workers:  # as worker/process.py: after the Workers running them have stopped
            await worker.acts.aclose()
        await pool.close()


async def fund(database_url: str, account_id: str, amount: int) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        store = PayoutStore(pool)
        ctx = LedgerContext(correlation_id=f"seed-{account_id}", actor="test")
        await store.create_account(account_id, ctx)
        await store.fund_account(account_id, amount, ctx)
    finally:
        await pool.close()


async def create_payout(database_url: str, payout_id: str, account_id: str, amount: int) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        store = PayoutStore(pool)
        ctx = LedgerContext(correlation_id=payout_id, actor="test")
        await store.create_payout(
            payout_id=payout_id, account_id=account_id, amount=amount, ctx=ctx
        )
    finally:
        await pool.close()


async def audit_rows(database_url: str, payout_id: str, action: str) -> list[asyncpg.Record]:
    """The payout's audit rows of one action (actor, action, details as JSON text)."""
    conn = await asyncpg.connect(database_url)
    try:
        return list(
            await conn.fetch(
                "SELECT actor, action, details::text AS details FROM paydb.audit_log"
                " WHERE payout_id = $1 AND action = $2",
                payout_id,
                action,
            )
        )
    finally:
        await conn.close()


async def wait_for(pred: Any, timeout_s: float = 30.0, every_s: float = 0.1) -> None:
    """tests.waiting.wait_for at the workflow tests' pace: a Temporal query every 0.1 s."""
    await waiting.wait_for(pred, timeout_s, every_s)


def operator_assertion(
    system: System,
    action: str,
    payout_id: str,
    reason: str = "drill: signed command",
    account_id: str | None = None,
) -> dict[str, Any]:
    """The lock server's operator assertion, obtained with the operator's token (as the CLI).
    A revoke's is bound to the lock key of `account_id` (the lock server refuses one without)."""
    body = {"action": action, "payout_id": payout_id, "reason": reason}
    if account_id is not None:
        body["key"] = f"payout:{account_id}"
    r = httpx.post(
        f"{system.lock_url}/v1/operator-assertions", json=body, headers=headers(), timeout=10
    )
    r.raise_for_status()
    assertion: dict[str, Any] = r.json()
    return assertion


def signed_command(
    system: System,
    action: str,
    payout_id: str,
    reason: str = "drill: signed command",
    account_id: str | None = None,
) -> m.OperatorCommand:
    """What `payouts payout revoke|abandon` sends: the asserted identity, the reason, and the
    assertion itself."""
    a = operator_assertion(system, action, payout_id, reason, account_id)
    return m.OperatorCommand(operator=a["identity"], reason=reason, assertion=a)


async def failed_attempts(handle: WorkflowHandle[Any, Any], activity: str) -> int:
    """How many activities of this type failed or timed out in the workflow's latest run."""
    scheduled: dict[int, str] = {}
    failed = 0
    async for e in handle.fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        for attrs in (
            "activity_task_failed_event_attributes",
            "activity_task_timed_out_event_attributes",
        ):
            if (
                e.HasField(attrs)
                and scheduled.get(getattr(e, attrs).scheduled_event_id) == activity
            ):
                failed += 1
    return failed


def lock_info(system: System, key: str) -> dict[str, Any]:
    """The lock server's inspect of `key` (holder, token, waiters, ...), as an operator sees it."""
    r = httpx.get(f"{system.lock_url}/v1/locks", params={"key": key}, headers=headers(), timeout=10)
    r.raise_for_status()
    info: dict[str, Any] = r.json()
    return info


def lock_token(system: System, key: str) -> int | None:
    """The token currently holding `key` at the lock server (an operator's inspect)."""
    token: int | None = lock_info(system, key)["token"]
    return token


def key_grants(system: System, key: str) -> list[dict[str, Any]]:
    """Every grant of exactly `key` in the lock server's history, oldest first."""
    r = httpx.get(f"{system.lock_url}/v1/history", params={"prefix": key}, headers=headers())
    r.raise_for_status()
    return [g for g in r.json()["grants"] if g["key"] == key]
