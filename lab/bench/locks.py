"""Benchmark (`python -m lab.bench.locks`, `make bench-locks`): uncontended acquire+release
through SDK -> lock server -> backend, for each backend, beside two floors measured in the same
run, interleaved round by round with it so that all three see the same machine load:

- `floor_*`: the minimal raw backend operations for one acquire+release from this same Python
  process (etcd: one txn + one delete with aetcd; PostgreSQL: an upsert + an update with asyncpg);
- `http_floor_*`: what the lock server cannot avoid: the raw operations above plus the two HTTP
  round trips an acquire+release needs (acquire, release), each to a trivial endpoint (`/livez`)
  of the same lock server process (FastAPI on uvicorn) through the SDK's own transport. One
  sample is one such sequence, timed as a whole. `http_rtt_*` is one such round trip alone;
- `backend_*`: the project's own backend class (lockservice.server.backends, the code the server
  runs) doing acquire+release in this process, no HTTP: what the backend's real statements cost
  beyond the minimal floor (history rows, epoch, waiter wake-ups), and its events, written
  to a file as the server writes them.
- `untraced_*`: the same acquire+release through a second lock server started with
  OTEL_SDK_DISABLED=true, on plain HTTP, and an untraced client; the main figures (p50/p99)
  are traced as a payout's are and over TLS (both on are the defaults): the client's span and
  `traceparent`, the server's spans of the request and its statements, exported to a file,
  and https verified against a CA of the benchmark's own (issue 27 §3). The HTTP floors are
  measured against the plain server.

Owns: starting (and always stopping) its own servers: embedded PostgreSQL unless DATABASE_URL is
set (then a fresh database on that server, dropped at the end), embedded etcd unless
ETCD_ENDPOINTS is set, and one `python -m lockservice serve` subprocess per backend.
Must never: assert anything (it reports), or leave a process behind.
`postgres_sync` is the PostgreSQL backend again, on an embedded primary whose every commit waits
for a synchronous standby's flush (stack.replication, NFR-05), beside its own floors on that pair;
`sync_standby_added_p50_ms` is its p50 minus the plain PostgreSQL one. The pair is always
embedded and private, DATABASE_URL or not.
`ab` (lab.bench.locks_ab, skipped with `--ab-n 0`): the SDK's own transport against httpx's in
the same run, with the client's CPU per operation.
Prints progress, a table, then as its LAST line exactly one JSON object with p50/p99 and the
floors per backend, and /proc/loadavg before and after (the machine is shared: read the figures
beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from common import tracing
from common.credentials import issue_tokens, read_token, write_credentials
from common.logs import configure_logging
from common.pgutil import create_database, drop_database
from common.tracefile import read_spans
from lab.bench import locks_ab as bench_locks_ab
from lab.bench.locks_ab import LockServer
from lockservice import api
from lockservice.api import Grant, LockBackend
from lockservice.sdk import KeepAliveTransport, LockClient
from lockservice.server import create_backend, generate_keypair
from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import EmbeddedPostgres, PostgresTLS, start_tls_front
from stack.embedded.shared import free_port
from stack.pki import StackTLS, issue_stack_tls
from stack.replication import ReplicatedPostgres

WARMUP = 100


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3), "p99_ms": round(p99 * 1000, 3)}


Op = Callable[[], Awaitable[None]]
ROUNDS = 10


async def _interleaved(n: int, ops: dict[str, Op]) -> dict[str, list[float]]:
    """Samples of every op, `n` each, taken in ROUNDS alternating rounds after a warm-up, so a
    burst of load from elsewhere on the machine lands on all of them alike."""
    for op in ops.values():
        for _ in range(WARMUP):
            await op()
    out: dict[str, list[float]] = {name: [] for name in ops}
    per_round = max(1, n // ROUNDS)
    while any(len(v) < n for v in out.values()):
        for name, op in ops.items():
            samples = out[name]
            for _ in range(min(per_round, n - len(samples))):
                t0 = time.perf_counter()
                await op()
                samples.append(time.perf_counter() - t0)
    return out


def loadavg() -> str:
    """The 1/5/15-minute load averages (Linux), or "" where there are none."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


# --------------------------------------------------------------------------- floors


@contextlib.asynccontextmanager
async def etcd_floor(endpoints: list[str]) -> AsyncIterator[Op]:
    """One compare-and-put txn (attached to a lease) plus one delete: the least an acquire and a
    release can cost on etcd."""
    from lockservice.server import etcd_client

    client = etcd_client(endpoints[:1])  # the bench's plaintext etcd, or ETCD_ENDPOINTS' first
    await client.connect()
    try:
        # Outlives the whole interleaved run (never kept alive); revoked at the end.
        lease = await client.lease(3600)
        key = f"bench-floor/{uuid.uuid4().hex}".encode()
        t = client.transactions

        async def op() -> None:
            ok, _ = await client.transaction(
                compare=[t.create(key) == 0], success=[t.put(key, b"s", lease=lease)], failure=[]
            )
            assert ok
            await client.delete(key)

        yield op
        await client.revoke_lease(lease.id)
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def postgres_floor(database_url: str) -> AsyncIterator[Op]:
    """An upsert that grants and bumps a per-key counter, plus a compare-and-clear release:
    the statement pair an acquire+release needs at minimum, each its own autocommit.

    On an ordinary (WAL-logged) table, because a lock service's tokens must survive a restart
    (INV-04): each commit waits for its WAL flush like the real backend's. A TEMP table, which
    this floor used before, writes no WAL and measured about a sixth of the durable cost on this
    machine: a floor no lock service could reach (docs/performance.md)."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    table = f"bench_floor_{uuid.uuid4().hex[:12]}"
    try:
        await conn.execute(
            f"CREATE TABLE {table} (key text PRIMARY KEY, counter bigint NOT NULL, holder text)"
        )
        key = f"bench-floor/{uuid.uuid4().hex}"
        grant = await conn.prepare(
            f"INSERT INTO {table} AS f (key, counter, holder) VALUES ($1, 1, $2)"
            " ON CONFLICT (key) DO UPDATE SET counter = f.counter + 1, holder = $2"
            " WHERE f.holder IS NULL RETURNING counter"
        )
        release = await conn.prepare(
            f"UPDATE {table} SET holder = NULL WHERE key = $1 AND holder = $2 AND counter = $3"
        )

        async def op() -> None:
            token = await grant.fetchval(key, "s")
            assert token is not None
            await release.fetch(key, "s", token)

        yield op
    finally:
        with contextlib.suppress(asyncpg.PostgresError, OSError):
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()


# --------------------------------------------------------------------------- through the server


@contextlib.asynccontextmanager
async def lock_server(
    env: dict[str, str], log: Path, tls: StackTLS | None = None
) -> AsyncIterator[LockServer]:
    """A `python -m lockservice serve` subprocess on a free port (https with `tls`, as every
    local stack serves it: issue 27), and the worker token it accepts; terminated on exit."""
    port = free_port()
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


async def measure(  # noqa: PLR0917 - the run's servers, floors and provider, in order
    url: str,
    token: str,
    floor: Op,
    backend: LockBackend,
    n: int,
    untraced: LockServer,
    provider: TracerProvider | None,
    verify: ssl.SSLContext | bool = True,
) -> dict[str, list[float]]:
    """Through the server (traced, inside a span as in a payout's activity), through the
    untraced server, the raw floor, one HTTP round trip, the HTTP floor, and the backend class
    alone, interleaved."""
    # The SDK's own transport, over TLS to the defaults' server (lockservice.sdk.transport).
    traced: httpx.AsyncBaseTransport = KeepAliveTransport(
        verify if isinstance(verify, ssl.SSLContext) and url.startswith("https://") else None
    )
    tracer: trace.Tracer = trace.NoOpTracer()
    if provider is not None:
        from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport

        traced = AsyncOpenTelemetryTransport(traced, tracer_provider=provider)
        tracer = provider.get_tracer("bench-locks")
    # Nothing keeps this session alive: its lease must outlast the whole interleaved run, which
    # on a loaded machine took longer than 30 s (its acquires then failed: session expired).
    session = await backend.open_session(api.MAX_TTL_S)
    backend_key = f"bench-backend:{uuid.uuid4().hex[:12]}"

    async def direct() -> None:
        grant = await backend.acquire(session.session_id, backend_key, 0.0)
        assert isinstance(grant, Grant)
        await backend.release(grant)

    async with (
        LockClient(url, token=token, transport=traced) as locks,
        LockClient(untraced[0], token=untraced[1], transport=KeepAliveTransport()) as plain,
        httpx.AsyncClient(base_url=untraced[0], transport=KeepAliveTransport()) as http,
    ):
        key = f"bench:{uuid.uuid4().hex[:12]}"

        async def server() -> None:
            with tracer.start_as_current_span("bench.acquire_release"):
                lease = await locks.acquire(key)
                await locks.release(lease)

        async def server_untraced() -> None:
            lease = await plain.acquire(key)
            await plain.release(lease)

        async def rtt() -> None:
            (await http.get("/livez")).raise_for_status()

        async def http_floor() -> None:
            await rtt()  # the acquire's round trip
            await rtt()  # the release's round trip
            await floor()  # the backend work of both

        ops = {"server": server, "untraced": server_untraced, "floor": floor, "http_rtt": rtt}
        ops["http_floor"] = http_floor
        ops["backend"] = direct
        try:
            return await _interleaved(n, ops)
        finally:
            await backend.close_session(session.session_id)


# --------------------------------------------------------------------------- servers


@contextlib.contextmanager
def _etcd(work: Path) -> Iterator[list[str]]:
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
async def _postgres(work: Path, tls: PostgresTLS) -> AsyncIterator[tuple[str, str]]:
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


async def run(n: int, ab_n: int = 0) -> dict[str, Any]:
    """The figures; with `ab_n`, the A/B too (lab.bench.locks_ab)."""
    result: dict[str, Any] = {"n": n, "loadavg_before": loadavg()}
    with tempfile.TemporaryDirectory(prefix="lockbench-") as d, contextlib.ExitStack() as stack:
        work = Path(d)
        # The embedded PostgreSQL runs as an unprivileged user under root.
        work.chmod(0o755)  # noqa: ASYNC240 - start-up, outside the measured loop
        print(f"work dir {work}; n={n} (+{WARMUP} warm-up) per measurement", flush=True)
        # The backend class measured in-process emits its events, as in the server: to a file.
        events = stack.enter_context((work / "backend-events.log").open("a"))
        configure_logging("lock-bench", stream=events)
        # The defaults' side serves TLS with certificates of a CA of its own (stack.pki), and
        # reaches PostgreSQL through a TLS front, as a local stack's lock server does.
        tls = issue_stack_tls(work / "tls")
        async with _postgres(work, tls.postgres()) as (db, tls_db):
            with _etcd(work) as endpoints:
                prefix = f"bench{uuid.uuid4().hex[:8]}/"
                env = {
                    "etcd": {"LOCK_BACKEND": "etcd", "ETCD_ENDPOINTS": ",".join(endpoints)},
                    "postgres": {"LOCK_BACKEND": "postgres", "DATABASE_URL": db},
                }
                floors: dict[str, Callable[[], contextlib.AbstractAsyncContextManager[Op]]] = {
                    "etcd": lambda: etcd_floor(endpoints),
                    "postgres": lambda: postgres_floor(db),
                }
                provider = tracing.tracer_provider("bench-locks", trace_dir=work / "traces")
                (work / "untraced").mkdir()  # the untraced servers' own keys and tokens
                shape = work, provider, tls
                tls_env = {"postgres": {"DATABASE_URL": tls_db}}
                for kind in ("etcd", "postgres"):
                    where = db, endpoints
                    result[kind] = await _one_kind(
                        kind, env[kind], floors[kind], where, n, prefix, shape, tls_env.get(kind)
                    )
                if ab_n:
                    result["ab"] = await _ab(work, db, prefix, tls, ab_n)
                async with _sync_pair(work) as sync_db:
                    pg_env = {"LOCK_BACKEND": "postgres", "DATABASE_URL": sync_db}
                    where = sync_db, []
                    sync = await _one_kind(
                        SYNC, pg_env, lambda: postgres_floor(sync_db), where, n, prefix, shape
                    )
                result[SYNC] = sync
                result["sync_standby_added_p50_ms"] = round(
                    sync["p50_ms"] - result["postgres"]["p50_ms"], 3
                )
                if provider is not None:
                    provider.shutdown()
                # What the traced side really recorded (client and servers; the untraced: none).
                result["traced_spans"] = len(read_spans(work / "traces"))
    result["loadavg_after"] = loadavg()
    return result


async def _ab(work: Path, db: str, prefix: str, tls: StackTLS, n: int) -> dict[str, Any]:
    """An untraced TLS lock server on PostgreSQL for lab.bench.locks_ab."""
    print(f"A/B: the SDK's transport, {n} per side", flush=True)
    (work / "ab").mkdir()
    env = {"LOCK_BACKEND": "postgres", "DATABASE_URL": db, "OTEL_SDK_DISABLED": "true"}
    env["LOCK_KEY_PREFIX"] = f"{prefix}ab/"
    async with lock_server(env, work / "ab" / "server.log", tls) as server:
        return await bench_locks_ab.measure_ab(server, tls.client_context(), n)


#: The PostgreSQL backend on a primary whose every commit waits for a synchronous standby's
#: flush (stack.replication), reached through the multi-host DSN: what NFR-05 costs.
SYNC = "postgres_sync"


async def _one_kind(  # noqa: PLR0917 - one backend's servers, floor, and the run's shape
    kind: str,
    env: dict[str, str],
    floor_cm: Callable[[], contextlib.AbstractAsyncContextManager[Op]],
    where: tuple[str, list[str]],
    n: int,
    prefix: str,
    run: tuple[Path, TracerProvider | None, StackTLS],
    tls_env: dict[str, str] | None = None,
) -> dict[str, float]:
    """One backend kind: a TLS+traced and a plain+untraced lock server on it, its floor and the
    backend class in process, measured interleaved. `tls_env`: what the TLS side is given
    instead (the PostgreSQL DSN through the TLS front)."""
    work, provider, tls = run
    print(f"{kind}: starting lock servers (TLS+traced, plain+untraced)", flush=True)
    server_env = {**env, "LOCK_KEY_PREFIX": prefix}
    traced_env = {**server_env, tracing.TRACE_DIR_VAR: str(work / "traces"), **(tls_env or {})}
    plain_env = {**server_env, "OTEL_SDK_DISABLED": "true"}
    db, endpoints = where
    async with (
        lock_server(traced_env, work / f"server-{kind}.log", tls) as (url, token, _),
        lock_server(plain_env, work / "untraced" / f"server-{kind}.log") as plain,
        floor_cm() as floor,
        _backend(kind, db, endpoints, f"{prefix}direct/") as backend,
    ):
        print(f"{kind}: SDK -> {url} -> backend, and floors", flush=True)
        samples = await measure(
            url, token, floor, backend, n, plain, provider, tls.client_context()
        )
    stats = _stats(samples)
    print(f"{kind}: {stats}", flush=True)
    return stats


@contextlib.asynccontextmanager
async def _sync_pair(work: Path) -> AsyncIterator[str]:
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
async def _backend(
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


def _stats(samples: dict[str, list[float]]) -> dict[str, float]:
    stats = _ms(samples["server"])
    for name in ("untraced", "floor", "http_floor", "http_rtt", "backend"):
        s = _ms(samples[name])
        stats[f"{name}_p50_ms"], stats[f"{name}_p99_ms"] = s["p50_ms"], s["p99_ms"]
    stats["ratio_to_http_floor"] = round(stats["p50_ms"] / stats["http_floor_p50_ms"], 2)
    stats["tracing_added_p50_ms"] = round(stats["p50_ms"] - stats["untraced_p50_ms"], 3)
    return stats


def table(result: dict[str, Any]) -> str:
    """The figures as a readable table (ms)."""
    cols: tuple[str, ...] = ("p50_ms", "p99_ms", "untraced_p50_ms", "untraced_p99_ms")
    cols += ("http_floor_p50_ms", "http_floor_p99_ms")
    cols += ("floor_p50_ms", "floor_p99_ms", "http_rtt_p50_ms", "backend_p50_ms")
    cols += ("ratio_to_http_floor",)
    lines = ["backend   " + " ".join(f"{c.removesuffix('_ms'):>17}" for c in cols)]
    for kind in ("etcd", "postgres", SYNC):
        if kind in result:
            lines.append(f"{kind:<9} " + " ".join(f"{result[kind][c]:>17}" for c in cols))
    if "sync_standby_added_p50_ms" in result:
        lines.append(f"synchronous standby adds {result['sync_standby_added_p50_ms']} ms (p50)")
    if "ab" in result:
        lines.append(bench_locks_ab.table(result["ab"]))
    lines.append(f"loadavg before {result['loadavg_before']}  after {result['loadavg_after']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.locks", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="acquire+release pairs per backend")
    parser.add_argument(
        "--ab-n", type=int, default=2000, help="acquire+release pairs per A/B side (0: no A/B)"
    )
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.n, args.ab_n))
    print(table(result), flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
