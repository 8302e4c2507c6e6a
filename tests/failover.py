"""Helpers of the PostgreSQL failover tests (tests/lockservice/test_failover*.py): a private
primary/standby pair (stack.replication), the real lock server app over the real PostgreSQL
backend on the pair's multi-host DSN, and the calls a client makes across the failover."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from common.migrate import migrate
from lockservice.api import LockBackend
from lockservice.server import create_app, create_backend
from lockservice.server.watermark import Watermark, location_identity
from stack.replication import ReplicatedPostgres
from tests.waiting import wait_for

PREFIX = "fo_"


@contextlib.contextmanager
def own_pair(tmp_path: Path, *, synchronous: bool) -> Iterator[ReplicatedPostgres]:
    """A primary with a standby of its own (every test fails one over)."""
    tmp_path.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user under root
    pair = ReplicatedPostgres(base_dir=tmp_path / "pg", synchronous=synchronous, fast=True)
    pair.start()
    try:
        yield pair
    finally:
        pair.stop()


async def lock_server(
    url: str, state_dir: Path | None
) -> tuple[LockBackend, Watermark | None, Any]:
    """Every schema migrated, then the lock backend and server app on `url`, with its issuance
    watermark under `state_dir` (None: no watermark, restore/loss detection switched off)."""
    await migrate(url)
    backend = await create_backend("postgres", database_url=url, prefix=PREFIX)
    if state_dir is None:
        return backend, None, create_app(backend)
    wm = Watermark.open(state_dir, location_identity("postgres", PREFIX, url, []))
    await wm.check(backend)
    return backend, wm, create_app(backend, watermark=wm)


@contextlib.asynccontextmanager
async def http_of(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the lock server app, in process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        yield http


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
                PREFIX + key,
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
