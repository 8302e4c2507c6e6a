"""The replicated stack (issue 26 §1): 2 lock servers, 2 rail proxies and 2 outbox publishers
behind HAProxy, started through the Python API, as `payouts up --replicas 2` and the chaos runs
start it; and the balancer's configuration checked by `haproxy -c` itself.

What a replica's death must not change, shown on the real processes: the service URLs keep
answering (the balancer re-dispatches a refused connection and takes the dead replica out), a
payout made while one lock server and one proxy are dead reaches POSTED and the ledger, and each
replica keeps its own identity (health, attempts, audit) and its own issuance watermark.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest

from payouts.batch import PayoutSpec
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.balancer import Pool, haproxy_available, haproxy_binary, render, replica_names
from stack.config import StackConfig, StackError
from stack.pki import issue_stack_tls
from stack.system import Stack
from tests.jsonlogs import assert_every_line_json, service_logs
from tests.stack.conftest import assert_all_gone

HAPROXY = haproxy_binary() if haproxy_available() else None
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy absent: run `make haproxy`")


@needs_haproxy
@pytest.mark.parametrize("tls", [False, True])
def test_the_rendered_config_is_one_haproxy_accepts(tls: bool, tmp_path: Path) -> None:
    """`haproxy -c` (its own parser) accepts what stack.balancer writes, with and without TLS
    health checks (verified against a stack CA, which it loads)."""
    assert HAPROXY is not None
    ca = issue_stack_tls(tmp_path / "tls", None).ca_file if tls else None
    pools = [
        Pool("lock-server", 18701, [("lock-server-1", 18702), ("lock-server-2", 18703)]),
        Pool("railproxy", 18720, [("railproxy-1", 18721), ("railproxy-2", 18722)]),
    ]
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(render(pools, ca_file=ca))
    checked = subprocess.run(
        [HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_one_replica_keeps_todays_names_and_more_are_numbered() -> None:
    assert replica_names("railproxy", 1) == ["railproxy"]
    assert replica_names("railproxy", 3) == ["railproxy-1", "railproxy-2", "railproxy-3"]
    with pytest.raises(StackError, match="replicas=0"):
        StackConfig(replicas=0)


async def _health_replica(http: httpx.AsyncClient, url: str) -> str:
    r = await http.get(f"{url}/health")
    r.raise_for_status()
    return str(r.json()["replica"])


async def _posted(database_url: str, payout_id: str, within_s: float = 120.0) -> str | None:
    """The payout's state once POSTED, or its last state after `within_s` (a failure detector's
    bound, not a timing assertion)."""
    conn = await asyncpg.connect(database_url)
    try:
        state = None
        for _ in range(int(within_s / 0.25)):
            state = await conn.fetchval(
                "SELECT state FROM paydb.payouts WHERE payout_id = $1", payout_id
            )
            if state == "POSTED":
                break
            await asyncio.sleep(0.25)
        return state
    finally:
        await conn.close()


async def _booked(stack: Stack, account_id: str, within_s: float = 60.0) -> int:
    """The ledger.posted records the finance ledger holds for the account, once there is one
    (the publishers deliver in the background; the bound is a failure detector's)."""
    assert stack.finledger_url is not None
    async with httpx.AsyncClient(
        timeout=10, verify=stack.client_verify(), headers=stack.operator_headers()
    ) as http:
        booked = 0
        for _ in range(int(within_s / 0.5)):
            r = await http.get(
                f"{stack.finledger_url}/v1/records", params={"account_id": account_id}
            )
            r.raise_for_status()
            booked = sum(1 for rec in r.json()["records"] if rec["event_type"] == "ledger.posted")
            if booked:
                break
            await asyncio.sleep(0.5)
        return booked


@needs_haproxy
@pytest.mark.slow
async def test_two_of_each_behind_the_balancer_survive_a_dead_lock_server_and_proxy(
    stack_env: dict[str, str], stack_dir: Path, external_database_url: str | None
) -> None:
    config = StackConfig.from_env(
        stack_env,
        run_dir=stack_dir,
        workers=1,
        replicas=2,
        database_url=external_database_url,
        reconcile_every_s=None,
    )
    async with Stack(config) as stack:
        procs = stack.processes
        expected = {"balancer", "lock-server-1", "lock-server-2", "railproxy-1", "railproxy-2"}
        assert expected | {"outbox-1", "outbox-2"} <= set(procs)
        assert "lock-server" not in procs and "railproxy" not in procs
        # Each lock server its own issuance watermark, each process its own identity.
        dirs = {
            stack.launcher.procs[n].env["LOCK_STATE_DIR"]
            for n in ("lock-server-1", "lock-server-2")
        }
        assert len(dirs) == 2
        publishers = {
            stack.launcher.procs[n].env["OUTBOX_PUBLISHER_ID"] for n in ("outbox-1", "outbox-2")
        }
        assert publishers == {"outbox-1", "outbox-2"}
        async with httpx.AsyncClient(timeout=10, verify=stack.client_verify()) as http:
            for name in ("lock-server-1", "lock-server-2"):
                url = procs[name].url
                assert url is not None and url != stack.lock_url
                assert await _health_replica(http, url) == name
            assert await _health_replica(http, stack.lock_url) in {"lock-server-1", "lock-server-2"}

            # One lock server and one proxy die: the service URLs answer from the survivors.
            stack.kill("lock-server-1", signal.SIGKILL)
            stack.kill("railproxy-1", signal.SIGKILL)
            # Fresh connections each time (no keep-alive), so each one is balanced anew: a
            # refused connect is re-dispatched (retries, option redispatch) to the live one.
            for _ in range(10):
                async with httpx.AsyncClient(timeout=10, verify=stack.client_verify()) as fresh:
                    assert await _health_replica(fresh, stack.lock_url) == "lock-server-2"
                    r = await fresh.get(f"{stack.railproxy_url}/health")
                    assert r.status_code == 200

        # A payout made now goes through the survivors to POSTED, and to the ledger.
        prefix = f"rep{uuid.uuid4().hex[:6]}-"
        paydb = stack.role_dsn("PAYDB_DATABASE_URL")
        accounts = await seed_accounts(paydb, 1, 10_000, prefix)
        spec = PayoutSpec(f"{prefix}p", accounts[0], 100)
        await create_payouts(paydb, [spec])
        await start_workflows(stack.temporal_address, stack.config.task_queue, [spec])
        assert await _posted(stack.database_url, spec.payout_id) == "POSTED"
        conn = await asyncpg.connect(stack.database_url)
        try:
            replicas = await conn.fetch(
                "SELECT DISTINCT replica_id FROM railproxy.attempts WHERE payout_id = $1",
                spec.payout_id,
            )
        finally:
            await conn.close()
        assert [r["replica_id"] for r in replicas] == ["railproxy-2"]
        assert await _booked(stack, spec.account_id) >= 1

        # The dead replicas come back on their own ports and identities.
        await stack.restart("lock-server-1")
        await stack.restart("railproxy-1")
        async with httpx.AsyncClient(timeout=10, verify=stack.client_verify()) as http:
            url = stack.processes["lock-server-1"].url
            assert url is not None and await _health_replica(http, url) == "lock-server-1"
        logs = service_logs(stack)
        assert "balancer" in logs
        assert_every_line_json(logs)
        pids = {n: p.pid for n, p in stack.processes.items()}
    assert_all_gone(pids)
