"""NFR-05 on real servers: the PostgreSQL lock backend and a fence table on a primary with a
SYNCHRONOUS standby (stack.replication), reached through the multi-host DSN, across a failover
(primary SIGKILLed, standby promoted). The lock server is the real app over the real backend.

The grant and the fence committed before the kill are on the promoted node, and the next grant's
token is strictly greater. The asynchronous negative control is test_failover_async.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.failover import (
    acquire_after,
    fence,
    grant,
    grant_body,
    http_of,
    lock_server,
    once_reachable,
    own_pair,
    stored,
)


async def test_sync_failover_keeps_the_grant_and_the_fence(tmp_path: Path) -> None:
    with own_pair(tmp_path, synchronous=True) as pair:
        url = pair.url
        assert "target_session_attrs=read-write" in url and url.count("127.0.0.1:") == 2
        backend, wm, app = await lock_server(url, tmp_path / "lock-state")
        assert wm is not None
        try:
            async with http_of(app) as http:
                first = await grant(http, "acct-1")
                await fence(url, "acct-1", first["token"])
                old_primary = pair.primary.port

                await asyncio.to_thread(pair.failover)
                assert pair.primary.port != old_primary and not pair.standby.is_running()

                tokens, high = await stored(url, "acct-1", "acct-1")  # the same DSN, new node
                assert tokens == [first["token"]] and high == first["token"]

                # The committed grant is still the holder on the promoted node: it can be
                # released (a compare on key, session and token).
                r = await once_reachable(http, "/v1/locks/release", grant_body(first))
                assert r.status_code == 204, r.text
                nxt = await acquire_after(http, "acct-1")
                assert nxt.status_code == 200, nxt.text
                assert nxt.json()["token"] > first["token"] and not wm.blocked
        finally:
            await backend.close()
