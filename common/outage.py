"""Which database errors are an outage, and answering them 503: the outage contract of every
service whose database is its dependency (the rail proxy, the lock server's PostgreSQL backend).

Owns: `CONNECTION_LOST` and `connection_lost` (what asyncpg raises when a connection is lost,
closing or cannot be made), and `answer_outages`, which installs FastAPI exception handlers that
answer those 503 in the service's own error shape, so callers fail closed and retry.
Must never: answer a genuine bug (a syntax error, a constraint violation, bad input, a client
misconfiguration) as an outage: that stays a 500, loud, and is not retried into the ground; nor
import anything of the project.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
from fastapi import FastAPI, Request
from starlette.responses import Response

#: What asyncpg raises when the connection is lost, closing or cannot be made, or the server is
#: going away: the socket (OSError: refused, reset; TimeoutError: a connect or command timeout),
#: SQLSTATE class 08 (PostgresConnectionError, which includes ConnectionDoesNotExistError: the
#: connection closed mid-call), `connection is closed` / `pool is closing` (InterfaceError
#: itself), a connection the server dropped while it sat idle, used before its EOF was read
#: (InternalClientError: the protocol is still consuming the server's FATAL message), an
#: administrator's shutdown or a cancelled statement (class 57), too many connections (53), and
#: a session the server ended because it sat idle inside a transaction (25P03: the process was
#: frozen past `idle_in_transaction_session_timeout`, common.db_roles; its transaction is rolled
#: back and the connection closed).
CONNECTION_LOST: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
)
#: InterfaceError's subclasses are the client's configuration or a feature it lacks: a bug.
_NOT_LOST: tuple[type[Exception], ...] = (
    asyncpg.exceptions.ClientConfigurationError,
    asyncpg.exceptions.UnsupportedClientFeatureError,
    asyncpg.exceptions.UnsupportedServerFeatureError,
)


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` means the database is unreachable (503), rather than a bug (500)."""
    return isinstance(exc, CONNECTION_LOST) and not isinstance(exc, _NOT_LOST)


def answer_outages(app: FastAPI, respond: Callable[[Request, Exception], Response]) -> None:
    """Answer every `connection_lost` error a handler let escape with `respond` (a 503 in the
    service's error shape); any other error of those classes is re-raised, to be a 500."""

    async def handler(request: Request, exc: Exception) -> Response:
        if not connection_lost(exc):
            raise exc
        return respond(request, exc)

    for cls in CONNECTION_LOST:
        app.add_exception_handler(cls, handler)
