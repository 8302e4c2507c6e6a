"""The correlation id across process boundaries (STD01-11 distributed trace, issue 15).

Owns: the header name (`X-Correlation-Id`), where the current id lives (structlog's context
variables, key `correlation_id`, so every event emitted while it is bound carries it), the httpx
request hook that sends it, and the ASGI middleware that binds it for the request it came with.
Must never: invent an id, let a caller's header put anything but a bounded identifier into a log
line, or make a request fail because its correlation id is missing or malformed (it is dropped).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import structlog

HEADER = "X-Correlation-Id"
_KEY = "correlation_id"
_VALID = re.compile(r"^[A-Za-z0-9._:@+=~-]{1,128}$")  # railproxy.models.IDENT, bounded


def valid(value: str | None) -> str | None:
    """The id if it is a bounded identifier, else None (dropped, never an error)."""
    return value if value is not None and _VALID.match(value) else None


def current() -> str | None:
    """The correlation id bound in this context (task), if any."""
    value = structlog.contextvars.get_contextvars().get(_KEY)
    return value if isinstance(value, str) else None


@contextmanager
def bound(correlation_id: str | None) -> Iterator[None]:
    """Bind `correlation_id` for the block: every event emitted in it, and every request sent
    through a client with `httpx_hooks()`, carries it. A missing or invalid id binds nothing."""
    cid = valid(correlation_id)
    if cid is None:
        yield
        return
    with structlog.contextvars.bound_contextvars(**{_KEY: cid}):
        yield


async def _send_header(request: httpx.Request) -> None:
    cid = current()
    if cid is not None and HEADER not in request.headers:
        request.headers[HEADER] = cid


def httpx_hooks() -> dict[str, list[Any]]:
    """`event_hooks` for an httpx.AsyncClient: each request carries the bound correlation id."""
    return {"request": [_send_header]}


class CorrelationMiddleware:
    """Pure ASGI middleware: binds the request's `X-Correlation-Id` for the whole request (the
    handler runs in the same context) and echoes it in the response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or ()).get(HEADER.lower().encode())
        cid = valid(raw.decode("latin-1")) if raw is not None else None
        if cid is None:
            await self.app(scope, receive, send)
            return

        async def echo(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (HEADER.lower().encode(), cid.encode())]
            await send(message)

        with bound(cid):
            await self.app(scope, receive, echo)
