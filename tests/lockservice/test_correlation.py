"""The caller's correlation id reaches the lock server's events (issue 15, STD01-11): the SDK
sends the bound id as `X-Correlation-Id`, the server binds it per request, and the lock.acquired
and lock.released lines it writes for that request carry it, while another caller's do not."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx

from common import correlation
from lockservice.sdk import LockClient
from stack.embedded.shared import free_port
from tests.credentials import server_env, token
from tests.grants import lock_server_env
from tests.workflows.system import spawn, stop, wait_for, wait_healthy


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            out.append(event)
    return out


async def test_lock_server_events_carry_the_callers_correlation_id(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "lock.log"
    env = {
        "LOCK_BACKEND": "postgres",
        "LOCK_DATABASE_URL": database_url,
        "LOCK_PORT": str(port),
        "LOCK_KEY_PREFIX": f"corr{uuid.uuid4().hex[:6]}/",
        **lock_server_env(),
        **server_env("lock-server"),
    }
    proc = spawn(["-m", "lockservice", "serve"], env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", proc, log)
        cid, key = f"corr-{uuid.uuid4().hex[:10]}", f"payout:acct-{uuid.uuid4().hex[:8]}"
        async with LockClient(url, token=token("worker")) as locks:
            with correlation.bound(cid):
                lease = await locks.acquire(key, wait_s=2)
                await locks.release(lease)
            other = await locks.acquire(key, wait_s=2)  # nothing bound: no id
            await locks.release(other)

        async def logged() -> bool:
            return len([e for e in _events(log, "lock.released") if e.get("key") == key]) == 2

        await wait_for(logged, timeout_s=10)
        acquired = {e["token"]: e for e in _events(log, "lock.acquired") if e.get("key") == key}
        released = {e["token"]: e for e in _events(log, "lock.released") if e.get("key") == key}
        assert acquired[lease.token]["correlation_id"] == cid
        assert released[lease.token]["correlation_id"] == cid
        assert "correlation_id" not in acquired[other.token]
        # The server echoes the id; a malformed one is dropped, never an error.
        async with httpx.AsyncClient(base_url=url) as http:
            r = await http.get("/health", headers={correlation.HEADER: cid})
            assert r.headers[correlation.HEADER] == cid
            r = await http.get("/health", headers={correlation.HEADER: "bad id\tx"})
            assert r.status_code == 200 and correlation.HEADER not in r.headers
    finally:
        stop(proc)
