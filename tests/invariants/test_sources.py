"""The grant-history sources: the lock server's `GET /v1/history` over a real server gives the
checker the same answer as the PostgreSQL table, and the HTTP client refuses partial or failed
answers (the latter as unit tests over httpx.MockTransport)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
import pytest

from invariants.checker import GrantSourceUnavailable, lock_server_grant_source
from lockservice.server import create_app
from tests.invariants.conftest import World, lock_key, violated
from tests.lockservice.server_fixtures import serve_app


async def test_http_history_from_a_real_lock_server_matches_postgres(world: World) -> None:
    """Over the real lock server, a clean world is clean and an overlap is seen, as with the table."""
    a = await world.account()
    await world.pay(a, 1000)
    async with serve_app(create_app(world.locks)) as lock_url:
        http = lock_server_grant_source(lock_url)
        assert len(await http()) == 1
        assert (await world.check(http)).ok
        held = await world.grant(a)
        await world.execute(
            "INSERT INTO lockservice.grant_history (key, token, session_id, acquired_at)"
            f" VALUES ('{lock_key(a)}', {held.token + 1}, '{uuid.uuid4()}', clock_timestamp())"
        )
        over_http = await world.check(http)
    from_table = await world.check()
    await world.locks.release(held)
    assert violated(over_http) == violated(from_table) == {"INV-06"}
    assert over_http.as_dict()["invariants"] == from_table.as_dict()["invariants"]


GRANT = {
    "key": "payout:a",
    "token": 7,
    "session_id": "s",
    "acquired_at": "2026-01-01T00:00:00+00:00",
    "ended_at": None,
    "end_reason": None,
}


async def test_unit_mock_transport_parses_history_and_passes_prefix() -> None:
    """Unit (MockTransport): grants are parsed in server order and the key prefix is sent."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"grants": [GRANT], "truncated": False})

    source = lock_server_grant_source(
        "http://lock", key_prefix="payout:", transport=httpx.MockTransport(handler)
    )
    [grant] = await source()
    assert (grant.key, grant.token, grant.ended_at, grant.seq) == ("payout:a", 7, None, 0)
    assert seen[0].url.params["prefix"] == "payout:"


async def test_unit_mock_transport_carries_the_history_horizon() -> None:
    """Unit (MockTransport): a pruned history's `retained_since` reaches the checker."""
    body = {"grants": [GRANT], "truncated": False, "retained_since": "2026-01-01T00:00:00+00:00"}
    source = lock_server_grant_source(
        "http://lock", transport=httpx.MockTransport(lambda _: httpx.Response(200, json=body))
    )
    grants = await source()
    assert getattr(grants, "complete_since", None) == datetime(2026, 1, 1, tzinfo=UTC)
    complete = lock_server_grant_source(
        "http://lock",
        transport=httpx.MockTransport(
            lambda _: httpx.Response(200, json={"grants": [], "truncated": False})
        ),
    )
    assert getattr(await complete(), "complete_since", "missing") is None


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, json={"grants": [GRANT], "truncated": True}),
        httpx.Response(503, json={"code": "backend_unavailable"}),
        httpx.Response(200, text="not json"),
        httpx.Response(200, json={"grants": [{"key": "k"}], "truncated": False}),
    ],
    ids=["truncated", "http-503", "not-json", "malformed-grant"],
)
async def test_unit_mock_transport_refuses_partial_or_failed_history(
    response: httpx.Response,
) -> None:
    """Unit (MockTransport): a truncated, failed or malformed answer is GrantSourceUnavailable."""
    source = lock_server_grant_source(
        "http://lock", transport=httpx.MockTransport(lambda _: response)
    )
    with pytest.raises(GrantSourceUnavailable):
        await source()
