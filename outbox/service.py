"""The outbox publisher as a process: its pool, its /metrics endpoint, and its run until a signal.

Owns: starting one publisher (`run_publisher`: settings refusals first, then logging, tracing,
the pool and the metrics endpoint) and stopping it on SIGINT/SIGTERM. Started by
`python -m outbox` (the local stack, the container images) and by `payouts outbox run`.
Must never: deliver anything itself (that is `outbox.publisher`), or start with a DSN that would
cross a network unverified (its caller resolves and checks the DSN).
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from common import eventloop, tracing
from common.credentials import refuse_unreadable_token
from common.exiting import load_settings
from common.logs import configure_logging
from common.pgutil import create_pool
from outbox.delivery import OutboxSettings
from outbox.publisher import Publisher

__all__ = ["load_publisher_settings", "run_publisher", "serve_metrics"]


class _QuietHandler(WSGIRequestHandler):
    #: A connection that sends no complete request (or no TLS handshake) within this long is
    #: closed: an idle client must not hold its thread for ever.
    timeout = 10.0

    def log_message(self, format: str, *args: Any) -> None:
        return  # scrapes every few seconds: nothing here is an event


def serve_metrics(
    port: int, registry: CollectorRegistry, tls: ssl.SSLContext | None
) -> ThreadingWSGIServer:
    """prometheus_client's WSGI app on a daemon thread, as its `start_http_server` does, except
    that with TLS the handshake happens in the request's own thread (bounded by the handler's
    timeout): `start_http_server` does it in the one accepting thread, where a client that
    connects and sends nothing would stall every scrape and health check after it."""
    # All interfaces, as prometheus_client's default: a container's scraper is another host.
    app = make_wsgi_app(registry)
    server = make_server("0.0.0.0", port, app, ThreadingWSGIServer, handler_class=_QuietHandler)  # noqa: S104
    if tls is not None:
        server.socket = tls.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(target=server.serve_forever, name="outbox-metrics", daemon=True).start()
    return server


async def _run(url: str, settings: OutboxSettings) -> int:
    publisher_pool = await create_pool(url, min_size=1, max_size=min(settings.batch_size, 10) + 2)
    publisher = Publisher(publisher_pool, settings)
    if settings.metrics_port:
        # OUTBOX_TLS_CERT_FILE / OUTBOX_TLS_KEY_FILE: https only.
        serve_metrics(settings.metrics_port, publisher.metrics.registry, settings.server_context())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await publisher.run(stop)
    finally:
        await publisher.aclose()
        await publisher_pool.close()
    return 0


def load_publisher_settings() -> OutboxSettings:
    """The publisher's settings (OUTBOX_* env), or a refusal (exit 2) before anything starts."""
    settings = load_settings("outbox", OutboxSettings)
    # Before anything starts: the publisher reads its token only after opening its pool.
    refuse_unreadable_token(settings.token_file, "OUTBOX_TOKEN_FILE", "outbox")
    eventloop.check("outbox")
    return settings


def run_publisher(url: str, settings: OutboxSettings) -> int:
    """Deliver until SIGINT/SIGTERM, on the checked DSN `url`; the exit code."""
    configure_logging("outbox", level=settings.log_level, service=True)
    tracing.setup("outbox")  # each delivery joins the trace of the work that staged its row
    return eventloop.run(_run(url, settings))  # uvloop (common.eventloop)
