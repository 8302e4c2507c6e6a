"""The SDK's keep-alive HTTP/1.1 transport (lockservice.sdk.transport) against real uvicorn servers:
it reuses one connection across requests, survives the server closing an idle connection, and
reports an unreachable server as an httpx transport error (so the SDK fails closed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from common.tls import client_context, uvicorn_ssl
from lockservice import api
from lockservice.sdk import KeepAliveTransport, LockClient
from lockservice.server import create_app
from stack.embedded.shared import free_port
from stack.pki import StackPKI
from tests.lockservice import server_fixtures as _fx
from tests.lockservice.fake_backend import FakeBackend

fake_backend = _fx.fake_backend  # fixture


async def test_connection_is_reused_and_idle_close_is_survived(fake_backend: FakeBackend) -> None:
    """Sequential requests share one connection; after the server drops it, the next request
    opens a fresh one and succeeds."""
    async with _fx.serve_app(create_app(fake_backend)) as url:
        transport = KeepAliveTransport()
        async with httpx.AsyncClient(base_url=url, transport=transport) as http:
            for _ in range(3):
                assert (await http.get("/livez")).json() == {"status": "ok"}
            assert len(transport._idle) == 1
            first = transport._idle[0]
            await http.post("/v1/sessions", json={"ttl_s": 5})
            assert transport._idle == [first]  # the same connection, still idle afterwards
            first[1].close()  # as if the server had closed it on its keep-alive timeout
            await asyncio.sleep(0.05)
            r = await http.post("/v1/locks/acquire", json={"session_id": "x", "key": "k"})
            assert r.status_code == 404 and r.json()["code"] == "session_not_found"
            assert transport._idle and transport._idle[0] is not first


async def test_unreachable_server_fails_closed() -> None:
    """A refused connection is an httpx.ConnectError, which the SDK turns into BackendUnavailable
    after its bounded retries (never a lease)."""
    url = f"http://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/livez")
    locks = LockClient(url, attempts=2, backoff_base_s=0.001)
    with pytest.raises(api.BackendUnavailable):
        await locks.open()
    await locks.close()


async def test_https_keeps_the_lean_transport_and_verifies_the_server(
    fake_backend: FakeBackend, tmp_path: Path
) -> None:
    """Over TLS (issue 27) the SDK keeps its keep-alive transport: one verified connection
    reused across requests; a server whose certificate another CA issued is a ConnectError
    (the SDK fails closed), and a plaintext transport is refused the https URL outright."""
    pki = StackPKI(tmp_path / "ca")
    cert = pki.issue("lock-server")
    tls = uvicorn_ssl(str(cert.cert), str(cert.key))
    async with _fx.serve_app(create_app(fake_backend), tls) as url:
        assert url.startswith("https://")
        transport = KeepAliveTransport(client_context(str(pki.ca_file)))
        async with httpx.AsyncClient(base_url=url, transport=transport) as http:
            for _ in range(3):
                assert (await http.get("/livez")).json() == {"status": "ok"}
            assert len(transport._idle) == 1
        other = StackPKI(tmp_path / "other").ensure_ca()
        wrong = KeepAliveTransport(client_context(str(other)))
        async with httpx.AsyncClient(base_url=url, transport=wrong) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get("/livez")
        async with httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            with pytest.raises(httpx.UnsupportedProtocol):
                await http.get("/livez")
        async with LockClient(url, verify=client_context(str(pki.ca_file))) as locks:
            lease = await locks.acquire("tls-key")
            assert lease.token >= 1
            await locks.release(lease)
