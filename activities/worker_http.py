"""The worker process's HTTP endpoint: `/metrics` (ours and the Temporal SDK's) and `/health`.

Owns: serving (over TLS when given a server context, as the local stack does) what the worker
knows of its own health (STD01-08): whether Temporal answers and the state of its lock session.
Must never: decide anything about a payout (a health answer is a
snapshot for probes and people, never for correctness), or call out to a dependency from the
serving thread (the event loop refreshes the snapshot; the thread only reads it).

Why hand-written on the standard library's ThreadingHTTPServer: prometheus_client's own
`start_http_server` serves its metrics page on every path, so `/health` answered 200 with the
metrics text whatever the worker's state; two routes over one snapshot need nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

#: How often the event loop refreshes the snapshot, and how stale it may be before /health
#: reports it as such (a stalled event loop is itself unhealthy).
REFRESH_S = 2.0
STALE_S = 10.0


class HealthSnapshot:
    """The latest health facts, replaced whole by the loop and read whole by the HTTP thread."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {"status": "starting", "at": None}

    def body(self) -> tuple[int, dict[str, Any]]:
        facts = dict(self.facts)
        at = facts.get("at")
        if at is not None and (datetime.now(UTC) - at).total_seconds() > STALE_S:
            facts["status"] = "unhealthy"
            facts["why"] = "the worker's event loop has not refreshed its health"
        facts["at"] = at.isoformat() if at is not None else None
        return (200 if facts["status"] == "ok" else 503), facts


async def refresh_forever(
    snapshot: HealthSnapshot,
    temporal_ok: Callable[[], Awaitable[bool]],
    lock_session: Callable[[], dict[str, Any]],
) -> None:
    """Every REFRESH_S: ask Temporal whether it answers, read the lock session's state."""
    while True:
        try:
            ok = await asyncio.wait_for(temporal_ok(), timeout=REFRESH_S)
        except Exception:  # any failure to answer is "not connected", never a crash of the loop
            ok = False
        session = lock_session()
        healthy = ok and session["session"] != "past_deadline"
        snapshot.facts = {
            "status": "ok" if healthy else "unhealthy",
            "temporal": "connected" if ok else "unreachable",
            "lock": session,
            "at": datetime.now(UTC),
        }
        await asyncio.sleep(REFRESH_S)


#: A connection that sends no complete request (or, over TLS, no handshake) within this long is
#: closed: an idle client must not hold a handler thread for ever.
REQUEST_TIMEOUT_S = 10.0


def serve(
    snapshot: HealthSnapshot,
    port: int,
    host: str = "127.0.0.1",
    tls: ssl.SSLContext | None = None,
) -> ThreadingHTTPServer:
    """Start serving /metrics and /health on a daemon thread; returns the server (shutdown()).
    With `tls` (common.tls.server_context), https only: a plaintext request gets no answer."""

    class Handler(BaseHTTPRequestHandler):
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
            elif self.path == "/health":
                status, body = snapshot.body()
                self._send(status, "application/json", json.dumps(body).encode())
            else:
                self._send(404, "application/json", b'{"code": "not_found"}')

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # probes every second would flood the log; nothing here is an event

    server = ThreadingHTTPServer((host, port), Handler)
    if tls is not None:
        # The handshake happens in the request's own thread, on its first read (bounded by the
        # handler's timeout), not in the accepting thread, which one silent client would stall.
        server.socket = tls.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="worker-http", daemon=True).start()
    return server
