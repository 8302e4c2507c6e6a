"""The one launcher of the project's HTTP services: the lock server, the rail proxy, the rail stub
and the finance ledger each serve their app through `serve`.

Owns: the order of a service's start (JSON logging and tracing first, then the app, so that
whatever the app's factory logs is an event too, and the app gets its server spans:
common.tracing) and the uvicorn configuration every service shares: uvicorn
installs no log handler of its own (`log_config=None`: its lines go through the root handler of
`common.logs` as JSON events), only its warnings and errors are kept, and there is no access log
(a request line carries ids in its path; services emit events for what they commit). Given a
certificate and key (`common.tls.ServerTLS`), a service serves TLS only: a plaintext request gets
no HTTP answer.
Must never: import anything of the project outside `common`, or start serving after a refusal
(each service's entry point checks its configuration and calls `common.exiting.refuse` first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from common import tracing
from common.logs import configure_logging


def serve(
    app_factory: Callable[[], Any],
    *,
    service: str,
    host: str,
    port: int,
    log_level: str = "INFO",
    tls: Mapping[str, Any] | None = None,
) -> None:
    """Configure logging as `service`, build the app, serve it on host:port until SIGINT/SIGTERM.

    `app_factory` is called once, after logging is configured. Exits are uvicorn's: on SIGINT or
    SIGTERM it shuts down gracefully (the app's lifespan ends) and then re-raises the signal, so
    the status is the signal's; it exits non-zero when the port cannot be bound or the lifespan
    start-up fails. `tls` is uvicorn's ssl_certfile/ssl_keyfile (`ServerTLS.uvicorn_ssl()`):
    empty, plain HTTP."""
    import uvicorn

    configure_logging(service, level=log_level, service=True)
    tracing.setup(service)
    uvicorn.run(
        _FlushSpansAtShutdown(tracing.instrument_app(app_factory())),
        host=host,
        port=port,
        log_level="warning",
        log_config=None,
        access_log=False,
        **dict(tls or {}),
    )


class _FlushSpansAtShutdown:
    """Pure ASGI wrapper: once the app's lifespan has shut down, the queued spans are exported.
    uvicorn re-raises SIGTERM after its shutdown, which ends the process without exit hooks, so
    the SDK's own flush at exit would never run."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def flush_after_shutdown(message: Any) -> None:
            await send(message)
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                tracing.shutdown()

        await self.app(scope, receive, flush_after_shutdown)
