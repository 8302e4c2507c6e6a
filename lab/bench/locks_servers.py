"""The servers `make bench-locks` (lab.bench.locks) runs against, each started and always
stopped: a `python -m lockservice serve` subprocess, embedded etcd (or ETCD_ENDPOINTS), a fresh
database on embedded PostgreSQL with its TLS front (or on DATABASE_URL's server, dropped at the
end), a private primary with a synchronous standby, and the backend class in this process.

Owns: starting and stopping them. Must never: leave a process or a database behind, or measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from common.credentials import issue_tokens, read_token, write_credentials
from common.pgutil import create_database, drop_database
from lab.bench.locks_ab import LockServer
from lockservice.api import LockBackend
from lockservice.server import create_backend, generate_keypair
from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import EmbeddedPostgres, PostgresTLS, start_tls_front
from stack.embedded.shared import free_port
from stack.pki import StackTLS
from stack.replication import ReplicatedPostgres

__all__ = ["bench_database", "etcd_endpoints", "in_process_backend", "lock_server", "sync_pair"]


@contextlib.asynccontextmanager
async def lock_server(
    env: dict[str, str], log: Path, tls: StackTLS | None = None
) -> AsyncIterator[LockServer]:
    """A `python -m lockservice serve` subprocess on a free port (https with `tls`, as every
    local stack serves it: issue 27), and the worker token it accepts; terminated on exit."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)  # its keys and tokens go beside its log
    keys = generate_keypair(log.parent / "keys", "bench-k1")  # every grant is signed
    # The benchmark calls as the worker does: with the worker's bearer credential.
    tokens = issue_tokens(log.parent / "tokens", {"worker": "component"})
    creds = write_credentials(log.parent / "lock-credentials.json", {"worker": "component"}, tokens)
    full_env = {
        **os.environ,
        "LOCK_CREDENTIALS_PATH": str(creds),
        "LOCK_SIGNING_KEY_PATH": str(keys.private_path),
        "LOCK_SIGNING_KEY_ID": keys.kid,
        **env,
        "LOCK_PORT": str(port),
        "LOCK_HOST": "127.0.0.1",
        **(tls.server_env("LOCK_", "lock-server") if tls else {}),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(  # noqa: ASYNC220 - start-up, outside the measured loop
            [sys.executable, "-m", "lockservice", "serve"], env=full_env, stdout=out, stderr=out
        )
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    verify = tls.client_context() if tls else True
    try:
        async with httpx.AsyncClient(base_url=url, verify=verify) as http:
            for _ in range(300):
                if proc.poll() is not None:
                    raise RuntimeError(f"lock server exited early; see {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/livez")).json().get("status") == "ok":
                        break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"lock server did not become healthy; see {log}")
        token = read_token(token_file=tokens["worker"], what="bench worker token")
        assert token is not None
        yield LockServer(url, token, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def etcd_endpoints(work: Path) -> Iterator[list[str]]:
    external = os.environ.get("ETCD_ENDPOINTS")
    if external:
        yield [e.strip().removeprefix("http://") for e in external.split(",") if e.strip()]
        return
    cluster = EmbeddedEtcd(base_dir=work / "etcd", size=1)
    try:
        cluster.start()
        yield cluster.endpoints
    finally:
        cluster.stop()


@contextlib.asynccontextmanager
async def bench_database(work: Path, tls: PostgresTLS) -> AsyncIterator[tuple[str, str]]:
    """A fresh database, as a plaintext DSN (the floors, the plain side) and as the TLS DSN the
    defaults' side uses: the embedded server's TCP port, and a TLS front (stack.pgtls, as in
    every local stack) on another port in front of the same server's socket. With DATABASE_URL,
    both are that server's DSN as given."""
    server_url = os.environ.get("DATABASE_URL")
    embedded, front = None, None
    if not server_url:
        embedded = EmbeddedPostgres(data_dir=work / "pg")
        server_url = await asyncio.to_thread(embedded.start)
    try:
        db = await create_database(server_url, prefix="lockbench")
        tls_db = db
        if embedded is not None:
            port = free_port()
            front = start_tls_front(port, embedded.socket_path, tls, work / "pg-tls.json")
            parts = urlsplit(db)
            tls_db = urlunsplit(
                (
                    parts.scheme,
                    f"postgres@127.0.0.1:{port}",
                    parts.path,
                    tls.url_query(),
                    "",
                )
            )
        try:
            yield db, tls_db
        finally:
            await drop_database(server_url, db)
    finally:
        if front is not None:
            front.terminate()
            await asyncio.to_thread(front.wait)
        if embedded is not None:
            await asyncio.to_thread(embedded.stop, "immediate")


@contextlib.asynccontextmanager
async def sync_pair(work: Path) -> AsyncIterator[str]:
    """A database on a private embedded primary with a synchronous standby (always embedded,
    DATABASE_URL or not: the benchmark arranges the replication itself)."""
    pair = ReplicatedPostgres(base_dir=work / "pg-sync", synchronous=True)
    await asyncio.to_thread(pair.start)
    try:
        db = await create_database(pair.url, prefix="lockbench")
        try:
            yield db
        finally:
            await drop_database(pair.url, db)
    finally:
        await asyncio.to_thread(pair.stop)


@contextlib.asynccontextmanager
async def in_process_backend(
    kind: str, db: str, endpoints: list[str], prefix: str
) -> AsyncIterator[LockBackend]:
    backend = await create_backend(
        "etcd" if kind == "etcd" else "postgres",
        database_url=db,
        etcd_endpoints=endpoints,
        prefix=prefix,
    )
    try:
        yield backend
    finally:
        await backend.close()
