"""TLS on the real local stack (issue 27 §1): every HTTP server of the project answers https
only, with a certificate of the stack's CA, and its clients verify it.

On one started stack (no worker: the servers are what is probed): a request with the stack's CA
succeeds (the positive control of each refusal below), a plaintext request to the same port gets
no HTTP answer, and a client that trusts another CA refuses the server's certificate. The setting
that turns a client's verification off is refused outside experiment mode, by a real component's
entry point.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from common.tls import client_context
from outbox.delivery import OutboxSettings
from railproxy.settings import ProxySettings
from stack.config import StackConfig
from stack.pki import StackPKI
from stack.system import Stack

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ("lock_url", "railstub_url", "railproxy_url", "finledger_url")


@pytest.fixture(scope="module")
async def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    from stack.config import Ports
    from tests.stack.conftest import external_database

    folder = tmp_path_factory.mktemp("tls-stack")
    folder.chmod(0o755)
    async with external_database("payouts_tls") as database_url:
        config = StackConfig.from_env(
            dict(os.environ),
            run_dir=folder,
            workers=0,
            ports=Ports.isolated(),
            database_url=database_url,
            reconcile_every_s=None,
        )
        async with Stack(config) as stack:
            yield stack


async def test_every_server_answers_https_with_the_stacks_ca(tls_stack: Stack) -> None:
    assert tls_stack.tls_ca_file is not None
    async with httpx.AsyncClient(timeout=10, verify=tls_stack.client_verify()) as http:
        for attr in SERVERS:
            url = getattr(tls_stack, attr)
            assert url.startswith("https://127.0.0.1:"), (attr, url)
            response = await http.get(f"{url}/health")
            assert response.status_code == 200, (attr, response.text)


async def test_a_plaintext_request_to_every_server_gets_no_http_answer(tls_stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        for attr in SERVERS:
            plain = getattr(tls_stack, attr).replace("https://", "http://", 1)
            with pytest.raises(httpx.TransportError):
                await http.get(f"{plain}/health")


async def test_a_certificate_from_another_ca_is_refused(tls_stack: Stack, tmp_path: Path) -> None:
    other_ca = StackPKI(tmp_path / "other").ensure_ca()
    async with httpx.AsyncClient(timeout=10, verify=client_context(str(other_ca))) as http:
        for attr in SERVERS:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"{getattr(tls_stack, attr)}/health")


def test_the_host_name_is_checked(tls_stack: Stack) -> None:
    """A server whose certificate does not name the host asked for is refused: the same
    connection to the rail stub, by a name its SANs carry (localhost) and by one they do not."""
    assert tls_stack.tls_ca_file is not None
    ctx = client_context(str(tls_stack.tls_ca_file))
    port = int(tls_stack.railstub_url.rsplit(":", 1)[1])

    def handshake(name: str) -> None:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=name),
        ):
            pass

    handshake("localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake("rail.example.com")


def test_verification_off_is_refused_outside_experiment_mode() -> None:
    with pytest.raises(ValueError, match=r"RAILPROXY_TLS_VERIFY=false .* refused outside"):
        ProxySettings(tls_verify=False)
    with pytest.raises(ValueError, match=r"OUTBOX_TLS_VERIFY=false .* refused outside"):
        OutboxSettings(tls_verify=False)
    # The experiment switch of the same component allows it (the FR-29 pattern).
    assert ProxySettings(tls_verify=False, experiment_mode=True).client_verify() is False
    assert ProxySettings(tls_verify=True).client_verify() is True


def test_the_proxy_process_refuses_to_start_with_verification_off() -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "RAILPROXY_TLS_VERIFY": "false",
        "RAILPROXY_CREDENTIALS_PATH": "/nonexistent",
    }
    result = subprocess.run(
        [sys.executable, "-m", "railproxy"],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "RAILPROXY_TLS_VERIFY=false" in result.stderr
    assert "refused outside experiment mode" in result.stderr


def test_a_server_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    cert = StackPKI(tmp_path).issue("railproxy")
    with pytest.raises(ValueError, match="RAILPROXY_TLS_CERT_FILE and RAILPROXY_TLS_KEY_FILE"):
        ProxySettings(tls_cert_file=str(cert.cert))


async def test_the_embedded_postgresql_speaks_only_verified_tls(tls_stack: Stack) -> None:
    """The stack's own PostgreSQL (behind its TLS front, stack.pgtls): every DSN it hands out
    says verify-full with the stack's CA, the servers started on them (the lock server's
    backend is PostgreSQL), and the same port refuses a plaintext startup."""
    if os.environ.get("DATABASE_URL"):
        pytest.skip("the stack was given DATABASE_URL: its server is not the embedded one")
    import asyncpg

    assert tls_stack.addresses is not None
    dsns = {"DATABASE_URL": tls_stack.database_url, **tls_stack.addresses.role_urls}
    for variable, dsn in dsns.items():
        assert "sslmode=verify-full" in dsn, variable
        assert f"sslrootcert={tls_stack.tls_ca_file}" in dsn, variable
    conn = await asyncpg.connect(tls_stack.database_url)
    try:
        assert conn._transport.get_extra_info("ssl_object") is not None
        assert await conn.fetchval("SELECT count(*) FROM pg_stat_activity") > 0
    finally:
        await conn.close()
    plain = tls_stack.database_url.split("?", 1)[0] + "?sslmode=disable"
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="TLS connections"):
        await asyncpg.connect(plain)


async def test_the_outbox_publishers_metrics_are_https_only(tls_stack: Stack) -> None:
    """The publisher's /metrics (prometheus_client's own TLS): the stack's CA verifies it, a
    plaintext request gets no HTTP answer. (A worker's endpoint: tests/activities.)"""
    url = tls_stack.processes["outbox"].url
    assert url is not None and url.startswith("https://127.0.0.1:"), url
    async with httpx.AsyncClient(timeout=10, verify=tls_stack.client_verify()) as http:
        assert (await http.get(f"{url}/metrics")).status_code == 200
    async with httpx.AsyncClient(timeout=10) as plain:
        with pytest.raises(httpx.TransportError):
            await plain.get(f"{url.replace('https://', 'http://', 1)}/metrics")
