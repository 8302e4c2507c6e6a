"""NFR-05 on real servers: the PostgreSQL lock backend and a fence table on a primary with a
streaming standby (stack.replication), reached through the multi-host DSN, across a failover
(primary SIGKILLed, standby promoted). The lock server is the real app over the real backend.

Synchronous: the grant and the fence committed before the kill are on the promoted node, and the
next grant's token is strictly greater. The asynchronous negative control is in
test_failover_async.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from common.migrate import migrate
from lockservice.api import LockBackend
from lockservice.backends import create_backend
from lockservice.server import create_app
from lockservice.watermark import Watermark, location_identity
from stack.replication import ReplicatedPostgres
from tests.waiting import wait_for

_PREFIX = "fo_"


@pytest.fixture
def sync_pair(tmp_path: Path) -> Iterator[ReplicatedPostgres]:
    """A primary with a synchronous standby of its own (every test fails one over)."""
    tmp_path.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user under root
    pair = ReplicatedPostgres(base_dir=tmp_path / "pg", synchronous=True, fast=True)
    pair.start()
    try:
        yield pair
    finally:
        pair.stop()


async def lock_server(url: str, state_dir: Path) -> tuple[LockBackend, Watermark, Any]:
    """The lock backend and server app on `url`, with its issuance watermark under state_dir."""
    await migrate(url, schemas={"lockservice", "railproxy"})
    backend = await create_backend("postgres", database_url=url, prefix=_PREFIX)
    wm = Watermark.open(state_dir, location_identity("postgres", _PREFIX, url, []))
    await wm.check(backend)
    return backend, wm, create_app(backend, watermark=wm)


@pytest.fixture
async def http_of() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    def make(app: Any) -> httpx.AsyncClient:
        clients.append(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lock")
        )
        return clients[-1]

    yield make
    for c in clients:
        await c.aclose()


async def grant(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    sid = (await http.post("/v1/sessions", json={"ttl_s": 120})).json()["session_id"]
    r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": key})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def fence(url: str, account: str, token: int) -> None:
    """What the rail proxy does with a grant's token: raise the account's fence (never lower)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO railproxy.account_fences (account_id, high_token) VALUES ($1, $2)"
            " ON CONFLICT (account_id) DO UPDATE SET high_token ="
            " greatest(railproxy.account_fences.high_token, EXCLUDED.high_token)",
            account,
            token,
        )
    finally:
        await conn.close()


async def stored(url: str, key: str, account: str) -> tuple[list[int], int | None]:
    """The grant history tokens of `key` and the account's fence, as the writable node has them."""
    conn = await asyncpg.connect(url)
    try:
        tokens = [
            r["token"]
            for r in await conn.fetch(
                "SELECT token FROM lockservice.grant_history WHERE key = $1 ORDER BY token",
                _PREFIX + key,
            )
        ]
        high = await conn.fetchval(
            "SELECT high_token FROM railproxy.account_fences WHERE account_id = $1", account
        )
        return tokens, high
    finally:
        await conn.close()


async def once_reachable(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> httpx.Response:
    """POST `path` until the server reaches the promoted node (calls on connections to the dead
    primary fail first, as 503 backend_unavailable, never as an answer); returns the first other
    answer."""
    answer: list[httpx.Response] = []

    async def answered() -> bool:
        r = await http.post(path, json=body)
        if r.status_code == 503 and r.json().get("code") == "backend_unavailable":
            return False
        answer.append(r)
        return True

    await wait_for(answered, timeout_s=60, every_s=0.2)
    return answer[0]


async def acquire_after(http: httpx.AsyncClient, key: str) -> httpx.Response:
    """A fresh session's acquire of `key`, once the server reaches the writable node."""
    r = await once_reachable(http, "/v1/sessions", {"ttl_s": 120})
    assert r.status_code == 200, r.text
    sid = r.json()["session_id"]
    return await once_reachable(http, "/v1/locks/acquire", {"session_id": sid, "key": key})


def grant_body(g: dict[str, Any]) -> dict[str, Any]:
    return {k: g[k] for k in ("key", "token", "session_id", "acquired_at", "expires_at")}


async def test_sync_failover_keeps_the_grant_and_the_fence(
    sync_pair: ReplicatedPostgres, tmp_path: Path, http_of: Any
) -> None:
    url = sync_pair.url
    assert "target_session_attrs=read-write" in url and url.count("127.0.0.1:") == 2
    backend, wm, app = await lock_server(url, tmp_path / "lock-state")
    http = http_of(app)
    try:
        first = await grant(http, "acct-1")
        await fence(url, "acct-1", first["token"])
        old_primary = sync_pair.primary.port

        await asyncio.to_thread(sync_pair.failover)
        assert sync_pair.primary.port != old_primary and not sync_pair.standby.is_running()

        tokens, high = await stored(url, "acct-1", "acct-1")  # the same DSN finds the new node
        assert tokens == [first["token"]] and high == first["token"]

        # The committed grant is still the holder on the promoted node: it can be released.
        r = await once_reachable(http, "/v1/locks/release", grant_body(first))
        assert r.status_code == 204, r.text
        nxt = await acquire_after(http, "acct-1")
        assert nxt.status_code == 200, nxt.text
        assert nxt.json()["token"] > first["token"] and not wm.blocked
    finally:
        await backend.close()
