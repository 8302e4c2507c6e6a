"""What `make bench-locks` (lab.bench.locks) measures and against what: the raw backend floors
(etcd: one txn + one delete; PostgreSQL: an upsert + an update, on a durable table), and one
backend kind's interleaved samples (through the traced TLS server, an untraced TLS one, the
untraced plain one, the floor, one HTTP round trip, the HTTP floor and the backend class in
process), as p50/p99.

Owns: measuring. Must never: start servers (lab.bench.locks_servers does, and stops them), or
assert.
"""

from __future__ import annotations

import contextlib
import ssl
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from lab.bench.locks_ab import LockServer
from lockservice import api
from lockservice.api import Grant, LockBackend
from lockservice.sdk import KeepAliveTransport, LockClient

__all__ = [
    "ROUNDS",
    "WARMUP",
    "Op",
    "etcd_floor",
    "kind_stats",
    "measure",
    "p50_p99_ms",
    "postgres_floor",
]

WARMUP = 100


def p50_p99_ms(samples: list[float]) -> dict[str, float]:
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


async def measure(  # noqa: PLR0917 - the run's servers, floors and provider, in order
    url: str,
    token: str,
    floor: Op,
    backend: LockBackend,
    n: int,
    untraced: LockServer,
    tls_untraced: LockServer,
    provider: TracerProvider | None,
    verify: ssl.SSLContext | bool = True,
) -> dict[str, list[float]]:
    """Through the server (traced, inside a span as in a payout's activity), through the
    untraced server, the raw floor, one HTTP round trip, the HTTP floor, and the backend class
    alone, interleaved; and through `tls_untraced`, a server as the default's but with tracing
    off, called by an untraced client: what TLS adds, apart from what tracing adds."""
    # The SDK's own transport, over TLS to the defaults' servers (lockservice.sdk.transport).
    context = verify if isinstance(verify, ssl.SSLContext) and url.startswith("https://") else None
    traced: httpx.AsyncBaseTransport = KeepAliveTransport(context)
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
        LockClient(
            tls_untraced[0], token=tls_untraced[1], transport=KeepAliveTransport(context)
        ) as tls_plain,
    ):
        key = f"bench:{uuid.uuid4().hex[:12]}"

        async def server() -> None:
            with tracer.start_as_current_span("bench.acquire_release"):
                lease = await locks.acquire(key)
                await locks.release(lease)

        async def server_untraced() -> None:
            lease = await plain.acquire(key)
            await plain.release(lease)

        async def server_tls_untraced() -> None:
            lease = await tls_plain.acquire(key)
            await tls_plain.release(lease)

        async def rtt() -> None:
            (await http.get("/livez")).raise_for_status()

        async def http_floor() -> None:
            await rtt()  # the acquire's round trip
            await rtt()  # the release's round trip
            await floor()  # the backend work of both

        ops: dict[str, Op] = {"server": server, "untraced": server_untraced}
        ops |= {"tls_untraced": server_tls_untraced, "floor": floor, "http_rtt": rtt}
        ops |= {"http_floor": http_floor, "backend": direct}
        try:
            return await _interleaved(n, ops)
        finally:
            await backend.close_session(session.session_id)


def kind_stats(samples: dict[str, list[float]]) -> dict[str, float]:
    """p50/p99 of each measurement and the ratio to the HTTP floor, and the gap between the
    default (TLS and tracing on) and the plain untraced server split in two:
    `tls_added_p50_ms` (the TLS untraced server over the plain one) and `tracing_added_p50_ms`
    (the default over the TLS untraced server), with the ratio the default would have with
    tracing off, `tls_untraced_ratio_to_http_floor`."""
    stats = p50_p99_ms(samples["server"])
    for name in ("untraced", "tls_untraced", "floor", "http_floor", "http_rtt", "backend"):
        s = p50_p99_ms(samples[name])
        stats[f"{name}_p50_ms"], stats[f"{name}_p99_ms"] = s["p50_ms"], s["p99_ms"]
    floor = stats["http_floor_p50_ms"]
    stats["ratio_to_http_floor"] = round(stats["p50_ms"] / floor, 2)
    stats["tls_untraced_ratio_to_http_floor"] = round(stats["tls_untraced_p50_ms"] / floor, 2)
    stats["tls_added_p50_ms"] = round(stats["tls_untraced_p50_ms"] - stats["untraced_p50_ms"], 3)
    stats["tracing_added_p50_ms"] = round(stats["p50_ms"] - stats["tls_untraced_p50_ms"], 3)
    return stats
