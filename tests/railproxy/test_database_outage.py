"""The outage contract (common.outage): while the proxy's database is down, its routes answer
503 (callers fail closed and retry), never 500; once it is back, they answer again.

A real outage on real PostgreSQL (tests/pgoutage.py): every connection of the proxy is
terminated and new ones are refused, so the pooled connections are dead (asyncpg raises
ConnectionDoesNotExistError or InternalClientError on them, or the pool's reconnect is
refused). The database is the proxy's own, migrated for this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from common.migrate import migrate
from common.pgutil import create_database, drop_database
from railproxy import create_app
from railproxy.models import HandoffCertainty
from tests.pgoutage import database_down
from tests.railproxy.conftest import proxy_settings, submit_request
from tests.servers import ServerThread


@pytest.fixture(scope="module")
async def own_db(pg_server_url: str) -> AsyncIterator[str]:
    url = await create_database(pg_server_url, prefix="rail_outage_t")
    await migrate(url, schemas={"railproxy"})
    yield url
    await drop_database(pg_server_url, url)


@pytest.fixture
def proxy_url(own_db: str, stub_server: ServerThread) -> Iterator[str]:
    server = ServerThread(create_app(proxy_settings(own_db, stub_server.url)))
    server.start()
    yield server.url
    server.stop()


async def _until_answered(http: httpx.AsyncClient, path: str) -> httpx.Response:
    """The first answer that is not a 503: the pool replaces its dead connections on demand."""
    for _ in range(20):  # a failure detector's bound: each try is a real round trip
        response = await http.get(path)
        if response.status_code != 503:
            return response
    raise AssertionError(f"{path} still 503 after the database came back")


async def test_reads_answer_503_while_the_database_is_down_then_recover(
    proxy_url: str, own_db: str, pg_server_url: str
) -> None:
    path = "/v1/payouts/p-outage/attempts"
    async with httpx.AsyncClient(base_url=proxy_url, timeout=30) as http:
        assert (await http.get(path)).status_code == 200  # the pool has live connections
        async with database_down(pg_server_url, own_db):
            down = await http.get(path)
            assert down.status_code == 503, down.text
            body = down.json()
            assert body["code"] == "STORE_UNAVAILABLE"
            assert body["handoff_certainty"] == HandoffCertainty.UNKNOWN  # a read cannot know
            assert (await http.get(path)).status_code == 503  # the reconnect is refused too
        back = await _until_answered(http, path)
        assert back.status_code == 200 and back.json()["attempts"] == []


async def test_a_submission_while_the_database_is_down_is_503_not_submitted(
    proxy_url: str, own_db: str, pg_server_url: str
) -> None:
    """Its first step (raising the fence) cannot reach the store: nothing was forwarded, which
    the answer says (NOT_SUBMITTED), so the caller may submit again under its grant."""
    req = submit_request()
    async with httpx.AsyncClient(base_url=proxy_url, timeout=30) as http:
        assert (await http.get("/v1/payouts/p-warm/attempts")).status_code == 200
        async with database_down(pg_server_url, own_db):
            down = await http.post("/v1/submissions", json=req.model_dump(mode="json"))
        assert down.status_code == 503, down.text
        assert down.json()["code"] == "STORE_UNAVAILABLE"
        assert down.json()["handoff_certainty"] == HandoffCertainty.NOT_SUBMITTED
        await _until_answered(http, f"/v1/payouts/{req.payout_id}/attempts")
        again = await http.post("/v1/submissions", json=req.model_dump(mode="json"))
        assert again.status_code == 200, again.text  # recovered: this time it is forwarded
