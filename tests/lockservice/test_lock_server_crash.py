"""No grant outlives its use across a lock-server crash (issue 24 item 6), on both backends.

A worker's release during a lock-server outage fails once its bounded retries are spent; its
session, kept alive by the heartbeat, survives the outage. Before the fix the SDK then forgot
the grant (its orphan reaper waited `request_timeout_s` and gave up after `attempts` tries),
and the account stayed blocked for as long as the process lived. Here the real lock server
(`python -m lockservice serve`, a subprocess over the real PostgreSQL or etcd backend) is
SIGKILLed with the release in flight and restarted on the same port after an outage longer
than every bounded retry of the SDK and shorter than the session TTL; another session's
acquire must then succeed within the bound derived below.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from lockservice import api
from lockservice.sdk import LockClient
from stack.embedded.shared import free_port
from tests.credentials import server_env, token
from tests.grants import lock_server_env
from tests.workflows.system import spawn, stop

#: The session outlives the outage by far (the server counts it from the last keepalive).
TTL_S, HEARTBEAT_S = 30.0, 1.0
#: Shorter than the default 5 s, so that the old reaper's whole span (below) stays short.
REQUEST_TIMEOUT_S = 2.0


async def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60  # a failure detector's bound, not a timing claim
    async with httpx.AsyncClient(timeout=1.0) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"lock server exited; see {log}")
            try:
                if (await http.get(f"{url}/livez")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"lock server not healthy; see {log}")


@pytest.fixture(params=["postgres", "etcd"])
def server_env_of_backend(request: pytest.FixtureRequest, key_prefix: str) -> dict[str, str]:
    """The lock server's environment on this test's backend (only that server is started)."""
    if request.param == "postgres":
        backend = {"LOCK_BACKEND": "postgres"}
        backend["LOCK_DATABASE_URL"] = str(request.getfixturevalue("lock_database_url"))
    else:
        endpoints = request.getfixturevalue("etcd_endpoints")
        backend = {"LOCK_BACKEND": "etcd", "LOCK_ETCD_ENDPOINTS": ",".join(endpoints)}
    return {
        **backend,
        "LOCK_KEY_PREFIX": key_prefix,
        **lock_server_env(),
        **server_env("lock-server"),
    }


async def test_a_release_lost_in_a_lock_server_crash_is_completed_once_it_is_back(
    server_env_of_backend: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL the lock server while a worker releases, keep it down longer than the SDK's
    bounded retries and shorter than the session TTL, restart it: the grant is released and the
    account is not blocked."""
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "lock-server.log"
    env = {**server_env_of_backend, "LOCK_PORT": str(port)}
    proc = spawn(["-m", "lockservice", "serve"], env, log)
    worker = LockClient(
        url,
        ttl_s=TTL_S,
        heartbeat_s=HEARTBEAT_S,
        request_timeout_s=REQUEST_TIMEOUT_S,
        token=token("worker"),
    )
    # Before the fix, a failed release was retried once more by a reaper that waited
    # request_timeout_s and made `attempts` tries: it had given up after this long. The outage
    # is longer than that, and shorter than the session TTL (minus a heartbeat).
    old_reaper_gave_up_s = worker.retry_budget_s + REQUEST_TIMEOUT_S + worker.retry_budget_s
    outage_s = old_reaper_gave_up_s + 1.0
    assert outage_s < TTL_S - HEARTBEAT_S
    # After the server is back, the pending release's next try comes within one backoff cap,
    # and its request takes less than one request timeout: the grant is gone by then, and a
    # waiting acquire is woken at once (the backends notify waiters of a release).
    bound_s = worker.backoff_max_s + REQUEST_TIMEOUT_S
    try:
        await _healthy(url, proc, log)
        await worker.open()
        key = "payout:acct-crash"
        lease = await worker.acquire(key, wait_s=0)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(api.BackendUnavailable):
            await worker.release(lease)  # the payout ended during the outage
        assert worker.releases_pending == 1
        await asyncio.sleep(outage_s - (time.monotonic() - killed_at))  # the fault itself
        assert worker.releases_pending == 1  # still owed: nothing gave up
        proc = spawn(["-m", "lockservice", "serve"], env, log)
        await _healthy(url, proc, log)
        assert worker.session_state()["session"] == "live"  # the outage was inside the window
        async with LockClient(url, ttl_s=TTL_S, token=token("worker")) as other:
            # Generous for a loaded machine: twice the bound. Before the fix this timed out
            # (the grant lived as long as the worker's heartbeat).
            nxt = await other.acquire(key, wait_s=2 * bound_s)
            assert nxt.token > lease.token
            await other.release(nxt)
        assert worker.releases_pending == 0
        events = log.read_text()
        assert f'"token": {lease.token}' in events and "lock.released" in events
    finally:
        await worker.close()
        stop(proc)
