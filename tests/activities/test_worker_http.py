"""The worker's own HTTP endpoint: /health reports Temporal connectivity and the lock session,
503 when either is wrong; /metrics is the Prometheus page. Real HTTP server; the two facts it
reports come from stand-in callables (what they read is tested with the real components)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities import worker_http
from common.tls import client_context, server_context
from stack.embedded.shared import free_port
from stack.pki import StackPKI


async def _serving(temporal_ok: bool, session: str) -> tuple[httpx.Response, httpx.Response]:
    snapshot = worker_http.HealthSnapshot()
    port = free_port()
    server = worker_http.serve(snapshot, port)

    async def temporal() -> bool:
        return temporal_ok

    def lock() -> dict[str, Any]:
        return {"session": session, "leases_held": 0, "seconds_to_deadline": None}

    refresher = asyncio.create_task(worker_http.refresh_forever(snapshot, temporal, lock))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(50):  # until the first refresh replaced "starting"
                health = await http.get("/health")
                if health.json()["status"] != "starting":
                    break
                await asyncio.sleep(0.05)
            return health, await http.get("/metrics")
    finally:
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refresher
        server.shutdown()


async def test_healthy_worker_answers_200_with_its_facts() -> None:
    """Temporal connected and a live session: 200 with both facts; /metrics is Prometheus text."""
    health, metrics = await _serving(True, "live")
    assert health.status_code == 200
    assert health.json()["temporal"] == "connected" and health.json()["lock"]["session"] == "live"
    assert metrics.status_code == 200 and "# HELP" in metrics.text


async def test_unreachable_temporal_or_a_lapsed_session_is_503() -> None:
    """Either fact wrong: 503, and the body says which."""
    no_temporal, _ = await _serving(False, "live")
    assert no_temporal.status_code == 503 and no_temporal.json()["temporal"] == "unreachable"
    lapsed, _ = await _serving(True, "past_deadline")
    assert lapsed.status_code == 503 and lapsed.json()["lock"]["session"] == "past_deadline"


async def test_with_tls_it_answers_https_only_and_a_silent_client_stalls_nobody(
    tmp_path: Path,
) -> None:
    """Over TLS (the local stack's default): https with the CA answers; plaintext gets no HTTP
    answer; a client that connects and never starts its handshake does not hold up the next."""
    pki = StackPKI(tmp_path)
    files = pki.issue("worker")
    port = free_port()
    server = worker_http.serve(
        worker_http.HealthSnapshot(), port, tls=server_context(str(files.cert), str(files.key))
    )
    try:
        with socket.create_connection(("127.0.0.1", port)):  # silent: no ClientHello
            async with httpx.AsyncClient(
                base_url=f"https://127.0.0.1:{port}",
                verify=client_context(str(pki.ca_file)),
                timeout=10,
            ) as http:
                assert (await http.get("/metrics")).status_code == 200
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as plain:
                with pytest.raises(httpx.TransportError):
                    await plain.get("/metrics")
    finally:
        server.shutdown()
