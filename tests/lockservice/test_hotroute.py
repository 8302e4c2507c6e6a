"""lockservice.server.hotroute: the hot routes' fast path answers every request exactly as FastAPI's own
handler does (status, body, headers), and refuses at build time a route it does not know."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from common.credentials import Credentials, Identity, authorizer, require, token_digest
from common.strict_query import reject_unknown_query
from lockservice.server.hotroute import hot_route
from lockservice.server.state import ServerMetrics
from lockservice.server.wire import AcquireIn, add_error_shapes

WORKER, OTHER = "w" * 43, "o" * 43
CREDS = Credentials(
    [
        (token_digest(WORKER), Identity("worker", "component")),
        (token_digest(OTHER), Identity("reconciler", "component")),
    ]
)
GOOD = {"session_id": "s-1", "key": "payout:1", "wait_s": 0.5}


def _app(fast: bool, calls: list[AcquireIn]) -> FastAPI:
    app = FastAPI(dependencies=[Depends(reject_unknown_query)])
    add_error_shapes(app, ServerMetrics())
    holder = require(CREDS, components=("worker",))

    async def acquire(body: AcquireIn) -> Response:
        calls.append(body)
        return JSONResponse({"key": body.key, "wait_s": body.wait_s})

    app.router.add_api_route(
        "/v1/locks/acquire",
        acquire,
        methods=["POST"],
        dependencies=[Depends(holder)],
        route_class_override=(
            hot_route(holder, authorizer(CREDS, components=("worker",))) if fast else APIRoute
        ),
    )
    return app


def _auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


JSON = {"content-type": "application/json"}
CASES: list[tuple[str, dict[str, str], bytes]] = [
    ("", {**JSON, **_auth(WORKER)}, json.dumps(GOOD).encode()),
    ("", {**JSON, "authorization": f"bearer   {WORKER} "}, json.dumps(GOOD).encode()),
    ("", {**JSON, **_auth(WORKER)}, json.dumps({**GOOD, "wait_s": 1}).encode()),
    ("", {**JSON, **_auth(WORKER)}, json.dumps({**GOOD, "extra": 1}).encode()),
    ("?x=1", {**JSON, **_auth(WORKER)}, json.dumps(GOOD).encode()),
    ("?", {**JSON, **_auth(WORKER)}, json.dumps(GOOD).encode()),
    ("", JSON, json.dumps(GOOD).encode()),
    ("", {**JSON, **_auth("nope")}, json.dumps(GOOD).encode()),
    ("", {**JSON, "authorization": f"Basic {WORKER}"}, json.dumps(GOOD).encode()),
    ("", {**JSON, **_auth(OTHER)}, json.dumps(GOOD).encode()),
    ("", {**JSON, **_auth(OTHER)}, b"{not json"),
    ("", {**JSON, **_auth(WORKER)}, b"{not json"),
    ("", {**JSON, **_auth(WORKER)}, b"\xff\xfe"),
    ("", {**JSON, **_auth(WORKER)}, b""),
    ("", {**JSON, **_auth(WORKER)}, b"null"),
    ("", {**JSON, **_auth(WORKER)}, b"[1]"),
    ("", {**JSON, **_auth(WORKER)}, json.dumps({**GOOD, "key": "bad key!"}).encode()),
    ("", {**JSON, **_auth(WORKER)}, json.dumps({**GOOD, "wait_s": -1}).encode()),
    ("", {**JSON, **_auth(WORKER)}, json.dumps({**GOOD, "wait_s": "NaN"}).encode()),
    ("", {**JSON, **_auth(WORKER)}, b'{"session_id": "s", "key": "k", "wait_s": NaN}'),
    ("", {"content-type": "text/plain", **_auth(WORKER)}, json.dumps(GOOD).encode()),
    ("", {"content-type": "application/json; charset=utf-8", **_auth(WORKER)}, b"{}"),
    ("", _auth(WORKER), json.dumps(GOOD).encode()),
]


async def _answers(fast: bool) -> list[tuple[int, Any, list[tuple[str, str]]]]:
    calls: list[AcquireIn] = []
    transport = httpx.ASGITransport(app=_app(fast, calls))
    out = []
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        for query, headers, body in CASES:
            r = await http.post(f"/v1/locks/acquire{query}", headers=headers, content=body)
            out.append((r.status_code, r.content, sorted(r.headers.items())))
    out.append((len(calls), b"endpoint calls", []))
    return out


async def test_fast_path_answers_every_request_as_fastapi_does() -> None:
    fast, standard = await _answers(True), await _answers(False)
    assert fast == standard
    statuses = {status for status, _, _ in standard[:-1]}
    assert {200, 401, 403, 422} <= statuses  # the cases reach success and every refusal


async def test_a_route_with_an_unknown_dependency_is_refused_when_built() -> None:
    holder = require(CREDS, components=("worker",))

    async def extra() -> None:
        return None

    async def acquire(body: AcquireIn) -> Response:
        return Response(status_code=204)

    app = FastAPI(dependencies=[Depends(reject_unknown_query)])
    with pytest.raises(TypeError, match="fast path"):
        app.router.add_api_route(
            "/v1/locks/acquire",
            acquire,
            methods=["POST"],
            dependencies=[Depends(holder), Depends(extra)],
            route_class_override=hot_route(holder, authorizer(CREDS, components=("worker",))),
        )
