"""common.outage: which asyncpg errors are an outage (503) and which are a bug (500), and the
handler that answers them, on a real FastAPI app."""

from __future__ import annotations

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from common.outage import answer_outages, connection_lost

LOST = [
    asyncpg.InternalClientError("protocol mid-message after the server dropped it"),
    asyncpg.InterfaceError("pool is closing"),
    asyncpg.InterfaceError("connection is closed"),
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.exceptions.ProtocolError("unexpected message"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.TooManyConnectionsError("too many connections"),
    ConnectionResetError(104, "Connection reset by peer"),
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError(),
]
BUGS = [
    asyncpg.PostgresSyntaxError("syntax error at or near"),
    asyncpg.UniqueViolationError("duplicate key value violates unique constraint"),
    asyncpg.exceptions.CheckViolationError("new row violates check constraint"),
    asyncpg.exceptions.UndefinedTableError("relation does not exist"),
    asyncpg.DataError("invalid input for query argument"),
    asyncpg.exceptions.ClientConfigurationError("bad DSN"),
    asyncpg.exceptions.UnsupportedClientFeatureError("not supported"),
    ValueError("a bug of ours"),
]


@pytest.mark.parametrize("exc", LOST, ids=lambda e: type(e).__name__)
def test_a_lost_closing_or_refused_connection_is_an_outage(exc: BaseException) -> None:
    assert connection_lost(exc)


@pytest.mark.parametrize("exc", BUGS, ids=lambda e: type(e).__name__)
def test_an_error_the_server_answered_or_a_client_bug_is_not(exc: BaseException) -> None:
    assert not connection_lost(exc)


def _app() -> FastAPI:
    app = FastAPI()
    raised = {
        "closing": asyncpg.InterfaceError("pool is closing"),
        "mid-protocol": asyncpg.InternalClientError("unexpected message"),
        "timeout": TimeoutError(),
        "misconfigured": asyncpg.exceptions.ClientConfigurationError("bad DSN"),
        "syntax": asyncpg.PostgresSyntaxError("syntax error at or near"),
    }

    @app.get("/{what}")
    async def fail(what: str) -> None:
        raise raised[what]

    answer_outages(app, lambda request, exc: JSONResponse({"down": True}, status_code=503))
    return app


@pytest.mark.parametrize(
    ("what", "status"),
    [
        ("closing", 503),
        ("mid-protocol", 503),
        ("timeout", 503),
        ("misconfigured", 500),  # an InterfaceError subclass, but a bug: not answered as down
        ("syntax", 500),
    ],
)
async def test_answer_outages_answers_503_for_outages_only(what: str, status: int) -> None:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        assert (await http.get(f"/{what}")).status_code == status
