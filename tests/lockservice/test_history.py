"""The durable grant history (`grant_history`, `GET /v1/history`) on BOTH real backends: it holds
exactly the grants issued in a recorded run, with the right end reasons and times, and a contended
run's recorded intervals never overlap (checked by the contract suite's checker, which has its
negative control in test_contract.py and another one here)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from datetime import timedelta

import httpx
import pytest

from lockservice.api import Grant, GrantRecord, InvalidRequest, LockBackend
from tests.lockservice import server_fixtures as _fx
from tests.lockservice.test_contract import Held, check_exclusive

live_server = _fx.live_server  # fixture
real_backend = _fx.real_backend  # fixture


async def _acquire(backend: LockBackend, sid: str, key: str, wait_s: float = 0) -> Grant:
    got = await backend.acquire(sid, key, wait_s)
    assert isinstance(got, Grant), got
    return got


def _intervals(records: list[GrantRecord]) -> list[Held]:
    assert all(r.ended_at is not None for r in records), "every grant of the run has ended"
    return [
        Held(r.token, r.acquired_at.timestamp(), r.ended_at.timestamp())  # type: ignore[union-attr]
        for r in records
    ]


async def test_history_matches_the_grants_of_a_recorded_run(backend: LockBackend) -> None:
    """Release, revoke, session close and expiry each leave exactly one history record with the
    issued token, the holder's session and the matching end reason; expiry ends at the session's
    deadline, before the next grant of the key."""
    a = await backend.open_session(30)
    b = await backend.open_session(30)
    released = await _acquire(backend, a.session_id, "acct:1")
    await backend.release(released)
    revoked = await _acquire(backend, b.session_id, "acct:1")
    await backend.force_revoke("acct:1", "alice", "drill")
    closed = await _acquire(backend, b.session_id, "acct:2")
    await backend.close_session(b.session_id)
    short = await backend.open_session(1)
    expired = await _acquire(backend, short.session_id, "acct:3")
    after = await _acquire(backend, a.session_id, "acct:3", 30)  # granted once the lease expired
    other = await _acquire(backend, a.session_id, "other:1")

    history = await backend.grant_history("acct:")
    got = [(r.key, r.token, r.session_id, r.end_reason) for r in history]
    assert got == [
        ("acct:1", released.token, a.session_id, "released"),
        ("acct:1", revoked.token, b.session_id, "revoked"),
        ("acct:2", closed.token, b.session_id, "session_closed"),
        ("acct:3", expired.token, short.session_id, "expired"),
        ("acct:3", after.token, a.session_id, None),  # still held
    ]
    by_token = {r.token: r for r in history if r.key == "acct:3"}
    assert history[0].acquired_at == released.acquired_at
    ended = by_token[expired.token].ended_at
    assert ended is not None and expired.acquired_at < ended <= after.acquired_at
    assert by_token[after.token].ended_at is None
    everything = await backend.grant_history()
    assert everything[:-1] == history and everything[-1].token == other.token
    assert len(await backend.grant_history("acct:", limit=2)) == 2
    with pytest.raises(InvalidRequest):
        await backend.grant_history("", limit=-1)


async def test_contended_history_has_no_overlapping_grants(backend: LockBackend) -> None:
    """6 sessions x 15 rounds on one key: the backend's own history holds all 90 grants and its
    intervals never overlap; the same records with one end moved past the next start fail."""
    issued: list[int] = []

    async def worker() -> None:
        s = await backend.open_session(30)
        for _ in range(15):
            g = await _acquire(backend, s.session_id, "hot", 30)
            issued.append(g.token)
            await asyncio.sleep(random.uniform(0, 0.002))
            await backend.release(g)
        await backend.close_session(s.session_id)

    await asyncio.gather(*(worker() for _ in range(6)))
    history = await backend.grant_history("hot")
    assert sorted(r.token for r in history) == sorted(issued) and len(issued) == 90
    assert {r.end_reason for r in history} == {"released"}
    check_exclusive(_intervals(history))
    # Negative control: the checker sees an overlap when one grant ends after the next began.
    first, second = history[0], history[1]
    late = dataclasses.replace(first, ended_at=second.acquired_at + timedelta(milliseconds=1))
    with pytest.raises(AssertionError, match="overlap"):
        check_exclusive(_intervals([late, *history[1:]]))


async def test_history_over_http(live_server: str) -> None:
    """GET /v1/history returns the grants under a prefix, honours `limit` (with `truncated`) and
    rejects a bad limit with a 422 JSON error."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        sid = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        tokens = []
        for key in ("h:1", "h:2", "h:2"):
            r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": key})
            assert r.status_code == 200, r.text
            tokens.append(r.json()["token"])
            if key == "h:2" and len(tokens) == 2:
                assert (await http.post("/v1/locks/release", json=r.json())).status_code == 204
        body = (await http.get("/v1/history", params={"prefix": "h:"})).json()
        assert body["truncated"] is False
        assert [(g["key"], g["token"], g["end_reason"]) for g in body["grants"]] == [
            ("h:1", tokens[0], None),
            ("h:2", tokens[1], "released"),
            ("h:2", tokens[2], None),
        ]
        assert all(g["session_id"] == sid for g in body["grants"])
        page = (await http.get("/v1/history", params={"prefix": "h:", "limit": 2})).json()
        assert [g["token"] for g in page["grants"]] == tokens[:2] and page["truncated"] is True
        bad = await http.get("/v1/history", params={"limit": -1})
        assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"
