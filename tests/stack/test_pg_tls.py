"""PostgreSQL over TLS (issue 27 §1): the embedded server behind its TLS front (stack.pgtls), on
a real server from pgserver's binaries, with asyncpg and (where installed) Debian's psql.

Each refusal has its positive control on the same server: a verify-full client connects, and
its session is TLS. Refused: a plaintext startup (with the front's FATAL message), a client that
trusts another CA, and a server certificate of another CA. A killed server looks like one (the
connection closes, no session), and a restart behind the same front serves again. A cancel
request reaches the server. A front whose parent dies exits by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from stack.embedded.postgres import EmbeddedPostgres
from stack.embedded.shared import free_port, port_is_open
from stack.pgtls import GSSENC_REQUEST, SSL_REQUEST
from stack.pki import StackPKI
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


async def _until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    async def predicate() -> bool:
        return check()

    await wait_for(predicate, timeout_s, every_s=0.1)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> StackPKI:
    folder = tmp_path_factory.mktemp("pg-tls-ca")
    folder.chmod(0o755)
    return StackPKI(folder)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: StackPKI) -> Iterator[EmbeddedPostgres]:
    folder = tmp_path_factory.mktemp("pg-tls")
    folder.chmod(0o755)
    pg = EmbeddedPostgres(data_dir=folder / "pg", fast=True, tls=pki.postgres_tls())
    pg.start()
    try:
        yield pg
    finally:
        pg.stop("immediate")


def _plain(url: str) -> str:
    return url.split("?", 1)[0]


async def test_a_verify_full_client_gets_a_tls_session(server: EmbeddedPostgres) -> None:
    assert "sslmode=verify-full" in server.url and "sslrootcert=" in server.url
    conn = await asyncpg.connect(server.url)
    try:
        assert await conn.fetchval("SELECT 1") == 1
        tls = conn._transport.get_extra_info("ssl_object")
        assert tls is not None and tls.version() in {"TLSv1.2", "TLSv1.3"}
    finally:
        await conn.close()


async def test_a_plaintext_startup_is_refused_with_a_fatal_error(server: EmbeddedPostgres) -> None:
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="TLS connections"):
        await asyncpg.connect(_plain(server.url) + "?sslmode=disable")


async def test_a_client_trusting_another_ca_refuses_the_server(
    server: EmbeddedPostgres, tmp_path: Path
) -> None:
    other = StackPKI(tmp_path / "other").ensure_ca()
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncpg.connect(_plain(server.url) + f"?sslmode=verify-full&sslrootcert={other}")


async def test_a_server_certificate_of_another_ca_is_refused(tmp_path: Path, pki: StackPKI) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    impostor = EmbeddedPostgres(
        data_dir=folder / "pg", fast=True, tls=StackPKI(tmp_path / "impostor").postgres_tls()
    )
    impostor.start()
    try:
        ours = _plain(impostor.url) + f"?sslmode=verify-full&sslrootcert={pki.ca_file}"
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncpg.connect(ours)
        conn = await asyncpg.connect(impostor.url)  # the control: its own CA verifies it
        await conn.close()
    finally:
        impostor.stop("immediate")


@pytest.mark.skipif(shutil.which("psql") is None, reason="no psql client on this machine")
def test_psql_connects_with_verify_full_and_is_refused_in_plaintext(
    server: EmbeddedPostgres,
) -> None:
    """libpq's own negotiation (SSLRequest, then TLS) through the front, as an operator's
    `psql "$DATABASE_URL"` from the stack's env file does."""
    ok = subprocess.run(
        ["psql", server.url, "-XAtc", "SELECT 42"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, "42"), ok.stderr
    plain = subprocess.run(
        ["psql", _plain(server.url) + "?sslmode=disable", "-XAtc", "SELECT 42"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode != 0
    assert "accepts TLS connections only" in plain.stderr


async def test_a_cancel_request_reaches_the_server(server: EmbeddedPostgres) -> None:
    """asyncpg cancels a timed-out query through a second connection (a CancelRequest): the
    front forwards it, so the statement ends at once and the session is usable again."""
    conn = await asyncpg.connect(server.url)
    try:
        with pytest.raises(TimeoutError):
            await conn.fetchval("SELECT pg_sleep(600)", timeout=0.5)
        assert await conn.fetchval("SELECT 1") == 1
        sleeping = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(600)%'"
        )
        assert sleeping == 0
    finally:
        await conn.close()


async def test_a_killed_server_closes_its_fronts_connections(tmp_path: Path, pki: StackPKI) -> None:
    """SIGKILL of the server (a machine dying; the chaos fault db_failover) leaves the front
    up, and a client's connection closes before any session, so that a multi-host DSN moves on
    to the next host instead of hanging."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    pg = EmbeddedPostgres(data_dir=folder / "pg", fast=True, tls=pki.postgres_tls())
    pg.start()
    try:
        pid = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
        os.killpg(pid, signal.SIGKILL)  # the server's whole group: its front is not in it
        await _until(lambda: not pg.is_running())
        assert port_is_open(pg.port), "the front outlives the server it fronts"
        with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError)):
            await asyncio.wait_for(asyncpg.connect(pg.url, timeout=10), 20)
    finally:
        pg.stop_front()
    assert not port_is_open(pg.port)


async def test_a_front_stops_on_sigterm_with_a_session_open(tmp_path: Path, pki: StackPKI) -> None:
    """SIGTERM while a client's TLS session is open (the stack stopping with a service still
    connected, or a front whose parent died): the front ends the session and exits. Before, the
    connection's task waited on the plaintext stream's close, which after the TLS upgrade
    nothing reports, and the front waited for that task for ever."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    pg = EmbeddedPostgres(data_dir=folder / "pg", fast=True, tls=pki.postgres_tls())
    pg.start()
    try:
        conn = await asyncpg.connect(pg.url)
        try:
            assert await conn.fetchval("SELECT 1") == 1
            front = pg.front_pid
            assert front is not None
            os.kill(front, signal.SIGTERM)
            await _until(lambda: pg.front_pid is None, timeout_s=30)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)
    finally:
        pg.stop("immediate")


def test_a_front_whose_parent_dies_exits(tmp_path: Path, pki: StackPKI) -> None:
    files = pki.issue("postgres")
    port = free_port()
    front = [
        sys.executable,
        *("-m", "stack.pgtls", "--listen", f"127.0.0.1:{port}"),
        *("--upstream-socket", str(tmp_path / "nothing")),
        *("--cert-file", str(files.cert), "--key-file", str(files.key), "--exit-with-parent"),
    ]
    parent_code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen({front!r}, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        asyncio.run(_until(lambda: port_is_open(port)))
        parent.kill()
        parent.wait()

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{child}/stat") as stat:  # reaped by init soon; a zombie is gone
                return stat.read().split()[2] == "Z"

        asyncio.run(_until(gone))
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_front_with_a_key_that_is_not_its_certificates_refuses_to_start(
    tmp_path: Path, pki: StackPKI
) -> None:
    a, b = pki.issue("postgres-a"), pki.issue("postgres-b")
    result = subprocess.run(
        [
            sys.executable,
            *("-m", "stack.pgtls", "--listen", f"127.0.0.1:{free_port()}"),
            *("--upstream-socket", str(tmp_path / "nothing")),
            *("--cert-file", str(a.cert), "--key-file", str(b.key)),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "pgtls.refused_to_start" in result.stderr


def test_a_gssapi_request_is_declined_and_tls_follows(server: EmbeddedPostgres) -> None:
    """libpq built with GSSAPI may ask for GSS encryption first: the front answers "N", and the
    client's SSLRequest that follows gets "S" and a verified handshake."""
    ctx = ssl.create_default_context(cafile=str(server.tls.ca_file if server.tls else ""))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(struct.pack("!II", 8, GSSENC_REQUEST))
        assert raw.recv(1) == b"N"
        raw.sendall(struct.pack("!II", 8, SSL_REQUEST))
        assert raw.recv(1) == b"S"
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in {"TLSv1.2", "TLSv1.3"}


def test_anything_but_a_negotiation_gets_the_fatal_error(server: EmbeddedPostgres) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
        answer = raw.recv(4096)
    assert answer.startswith(b"E") and b"28000" in answer and b"TLS connections only" in answer


async def test_large_transfers_cross_the_front_intact_both_ways(server: EmbeddedPostgres) -> None:
    """Tens of megabytes each way, as the front passes them on in many chunks (pausing the
    other side's reading while one side's write buffer is full): nothing lost or reordered."""
    conn = await asyncpg.connect(server.url)
    try:
        rows = await conn.fetch(
            "SELECT i, repeat(chr(65 + i % 26), 1000000) AS s FROM generate_series(0, 29) AS i"
        )
        assert [len(r["s"]) for r in rows] == [1_000_000] * 30
        assert all(set(r["s"]) == {chr(65 + r["i"] % 26)} for r in rows)
        blob = bytes(range(256)) * 80_000  # 20 MB to the server
        assert await conn.fetchval("SELECT md5($1::bytea)", blob) == hashlib.md5(blob).hexdigest()
    finally:
        await conn.close()
