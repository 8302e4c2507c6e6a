"""The outage contract (common.outage) of the lock server over its PostgreSQL backend: while
the database is down its routes answer 503 `backend_unavailable` (the SDK and the worker fail
closed and retry), never 500; once it is back, they answer again.

A real outage on real PostgreSQL (tests/pgoutage.py): every connection of the backend is
terminated and new ones are refused. The database is the lock server's own, for this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from common.db_roles import LOCKSERVICE
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from lockservice.server import create_app, create_backend
from tests.conftest import as_role
from tests.lockservice.server_fixtures import serve_app
from tests.pgoutage import database_down


@pytest.fixture(scope="module")
async def own_db(pg_server_url: str) -> AsyncIterator[str]:
    url = await create_database(pg_server_url, prefix="lock_outage_t")
    await migrate(url, schemas={"lockservice"})
    yield url
    await drop_database(pg_server_url, url)


@pytest.fixture
async def lock_url(own_db: str) -> AsyncIterator[str]:
    backend = await create_backend("postgres", database_url=as_role(own_db, LOCKSERVICE))
    try:
        async with serve_app(create_app(backend)) as url:
            yield url
    finally:
        await backend.close()


async def _until_answered(http: httpx.AsyncClient) -> httpx.Response:
    """The first answer that is not a 503: the backend replaces its dead connections."""
    for _ in range(20):  # a failure detector's bound: each try is a real round trip
        response = await http.post("/v1/sessions", json={"ttl_s": 15})
        if response.status_code != 503:
            return response
    raise AssertionError("still 503 after the database came back")


async def test_every_route_answers_503_while_the_database_is_down_then_recovers(
    lock_url: str, own_db: str, pg_server_url: str
) -> None:
    async with httpx.AsyncClient(base_url=lock_url, timeout=30) as http:
        opened = await http.post("/v1/sessions", json={"ttl_s": 15})
        assert opened.status_code == 200, opened.text
        session_id = opened.json()["session_id"]
        async with database_down(pg_server_url, own_db):
            calls = [
                http.post("/v1/sessions", json={"ttl_s": 15}),
                http.post(f"/v1/sessions/{session_id}/keepalive"),
                http.get("/v1/locks", params={"key": "outage:k"}),
                http.post(
                    "/v1/locks/acquire",
                    json={"session_id": session_id, "key": "outage:k", "wait_s": 0},
                ),
            ]
            for call in calls:
                down = await call
                assert down.status_code == 503, down.text
                assert down.json()["code"] == "backend_unavailable", down.text
            health = await http.get("/health")
            assert health.status_code == 503, health.text
        assert (await _until_answered(http)).status_code == 200
