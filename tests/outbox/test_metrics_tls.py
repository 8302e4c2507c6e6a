"""The outbox publisher's /metrics over TLS (outbox.service.serve_metrics, issue 27 §1): the
stack's CA verifies it, plaintext gets no HTTP answer, and a client that connects and never
starts its handshake holds up nobody (prometheus_client's own `start_http_server` handshakes in
its one accepting thread, where that client would stall every scrape after it)."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from common.tls import client_context, server_context
from outbox.service import serve_metrics
from stack.pki import StackPKI


async def test_https_only_and_a_silent_client_stalls_nobody(tmp_path: Path) -> None:
    pki = StackPKI(tmp_path)
    files = pki.issue("outbox")
    registry = CollectorRegistry()
    Counter("probe_total", "a metric to find", registry=registry).inc()
    server = serve_metrics(0, registry, server_context(str(files.cert), str(files.key)))
    port = server.server_port
    try:
        with socket.create_connection(("127.0.0.1", port)):  # silent: no ClientHello
            verify = client_context(str(pki.ca_file))
            async with httpx.AsyncClient(verify=verify, timeout=10) as http:
                page = await http.get(f"https://127.0.0.1:{port}/metrics")
            assert page.status_code == 200 and "probe_total 1.0" in page.text
            async with httpx.AsyncClient(timeout=10) as plain:
                with pytest.raises(httpx.TransportError):
                    await plain.get(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
