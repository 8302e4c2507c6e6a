"""The fast path of the lock server's hot routes (acquire, renew, release), beside FastAPI's own.

Why: FastAPI solves a route's dependency tree on every request (the app-wide query check, the
bearer credential, the body), and with this FastAPI that alone cost more CPU per acquire +
release than both /livez round trips of the benchmark's HTTP floor (docs/performance.md).

Owns: answering the one request shape a well-behaved worker sends (no query string,
`Content-Type: application/json`, a JSON body that validates as the route's body model, an
accepted and authorised bearer credential) by calling the endpoint with the validated model,
which is what FastAPI's handler would do with it. Every other request, and every request that
fails any of those checks, goes to FastAPI's own handler unchanged, which answers it as before
(the same status, body and headers: the HTTP contract and its error shapes stay FastAPI's).
Must never: call an endpoint for a request FastAPI's handler would refuse, authorise by any rule
but common.credentials' (`authorizer`, the decision `require` makes), or serve a route whose
dependencies it does not know (refused when the app is built).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from common.credentials import Identity, bearer_token
from common.strict_query import reject_unknown_query

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def hot_route(dependency: Callable[..., Any], check: Callable[[str | None], Identity]) -> type:
    """An APIRoute class for routes whose only dependencies are the app-wide query check and
    `dependency`, made from `check` (`common.credentials.as_dependency(check)`: one decision,
    however the request is served), and whose only parameter is one JSON body."""

    class _HotRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            standard = super().get_route_handler()
            name, model = _body_of(self, {reject_unknown_query, dependency})
            call = self.dependant.call
            assert call is not None

            async def handler(request: Request) -> Response:
                values = await _fast_values(request, name, model, check)
                if values is None:
                    return await standard(request)  # FastAPI answers, exactly as before
                response: Response = await call(**values)
                return response

            return handler

    return _HotRoute


def _body_of(route: APIRoute, known: set[Callable[..., Any]]) -> tuple[str, type[BaseModel]]:
    """The route's body parameter and model; refuses a route the fast path would get wrong."""
    d = route.dependant
    calls = {sub.call for sub in d.dependencies}
    if calls != known or d.path_params or d.query_params or d.header_params or d.cookie_params:
        raise TypeError(f"{route.path}: the fast path knows only the query check and the auth")
    # `_embed_body_fields` is FastAPI's own (private) flag for a body read as {"<name>": model}
    # (Body(embed=True)): no public name says it, so it is read here, and pyproject.toml pins
    # FastAPI to the minor release tests/lockservice/test_hotroute.py ran against for that reason.
    if len(d.body_params) != 1 or route._embed_body_fields:
        raise TypeError(f"{route.path}: the fast path needs exactly one body model")
    field = d.body_params[0]
    model = field.field_info.annotation
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{route.path}: the body is not a pydantic model")
    return field.name, model


async def _fast_values(
    request: Request, name: str, model: type[BaseModel], check: Callable[[str | None], Identity]
) -> dict[str, Any] | None:
    """The endpoint's arguments if every check FastAPI would make passes, else None."""
    headers = request.headers
    if request.scope.get("query_string") or headers.get("content-type") != "application/json":
        return None
    try:
        check(bearer_token(headers.get("authorization")))
    except HTTPException:
        return None
    body = await request.body()  # cached on the request: FastAPI's handler reads it again
    if not body:
        return None
    try:
        # As FastAPI: Starlette's request.json() (json.loads), then the model in python mode.
        return {name: model.model_validate(json.loads(body))}
    except (ValueError, ValidationError):  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        return None
