"""The negative control of NFR-05: an ASYNCHRONOUS standby promoted after the primary committed
grants it never received. The loss is made by construction, not by timing: the standby's WAL
receiver is stopped (stack.replication.detach_standby) before the grants are committed, so the
promoted node provably lacks them and would hand their tokens out again.

With the lock server's issuance watermark (lockservice.server.watermark) the reissued token is refused
(503 restore_detected) and never answered, so no downstream resource sees a token twice. Remove
the watermark's anchor check and the first test fails: PostgreSQL's sequence is WAL-logged 32
values ahead, so the promoted node's counter stands above the watermark. With the watermark
switched off (no LOCK_STATE_DIR) the same token is answered twice, and the invariant checker,
given the grant history as it stood before the failover beside the promoted node's, reports the
reissue as INV-04."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from invariants.checker import check_invariants
from invariants.sources import merged_grant_source, postgres_grant_source
from stack.replication import ReplicatedPostgres
from tests.failover import PREFIX, acquire_after, grant, grant_body, http_of, lock_server, own_pair


async def _no_movements() -> list[Any]:
    return []


async def lose_grants(pair: ReplicatedPostgres, http: httpx.AsyncClient) -> list[dict[str, Any]]:
    """One grant replicated (then released), the standby detached, grants on two keys committed
    on the primary only, then the primary killed and the standby promoted; returns those."""
    first = await grant(http, "acct-1")
    r = await http.post("/v1/locks/release", json=grant_body(first))
    assert r.status_code == 204, r.text
    await asyncio.to_thread(pair.wait_caught_up)
    await asyncio.to_thread(pair.detach_standby)
    lost = [await grant(http, "acct-1"), await grant(http, "acct-2")]
    await asyncio.to_thread(pair.failover)
    return lost


async def _history(url: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT key, token FROM lockservice.grant_history ORDER BY id")
    finally:
        await conn.close()
    return [(r["key"], r["token"]) for r in rows]


async def test_lost_grants_are_detected_and_their_tokens_never_answered_again(
    tmp_path: Path,
) -> None:
    with own_pair(tmp_path, synchronous=False) as pair:
        url = pair.url
        backend, wm, app = await lock_server(url, tmp_path / "lock-state")
        assert wm is not None
        try:
            async with http_of(app) as http:
                lost = await lose_grants(pair, http)
                assert lost[0]["token"] == 2
                # By construction: the promoted node has neither lost grant.
                assert await _history(url) == [(PREFIX + "acct-1", 1)]

                r = await acquire_after(http, "acct-1")  # the node would answer token 2 again
                assert r.status_code == 503 and r.json()["code"] == "restore_detected", r.text
                assert wm.blocked
                r = await acquire_after(http, "acct-9")  # and it keeps refusing, any key
                assert r.status_code == 503 and r.json()["code"] == "restore_detected", r.text
        finally:
            await backend.close()


async def test_without_detection_the_token_is_reissued_and_inv04_reports_it(
    tmp_path: Path,
) -> None:
    with own_pair(tmp_path, synchronous=False) as pair:
        url = pair.url
        backend, _, app = await lock_server(url, None)  # no watermark: detection off
        try:
            async with http_of(app) as http:
                first = await grant(http, "acct-1")
                r = await http.post("/v1/locks/release", json=grant_body(first))
                assert r.status_code == 204, r.text
                await asyncio.to_thread(pair.wait_caught_up)
                await asyncio.to_thread(pair.detach_standby)
                lost = await grant(http, "acct-1")
                # What an auditor kept of the history before the failover (an archive of it).
                before = await postgres_grant_source(url, backend_prefix=PREFIX)()
                await asyncio.to_thread(pair.failover)
                again = await acquire_after(http, "acct-1")
                assert again.status_code == 200 and again.json()["token"] == lost["token"]

            async def archived() -> Any:
                return before

            sources = [archived, postgres_grant_source(url, backend_prefix=PREFIX)]
            conn = await asyncpg.connect(url)
            try:
                report = await check_invariants(conn, _no_movements, merged_grant_source(sources))
            finally:
                await conn.close()
            counts = {r.invariant: r.count for r in report.results}
            # The reissue (INV-04), and the lost grant (never ended, as the archive has it)
            # overlapping the reissued one on the same key (INV-06); nothing else.
            expected = {f"INV-{i:02d}": 0 for i in range(1, 11)} | {"INV-04": 1, "INV-06": 1}
            assert counts == expected, report
        finally:
            await backend.close()
