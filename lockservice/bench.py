"""Benchmark (`python -m lockservice.bench`, `make bench-locks`): uncontended acquire+release
through SDK -> lock server -> backend, for each backend, beside the floor measured in the same run:
the minimal raw backend operations for one acquire+release from this same Python process
(etcd: one txn + one delete with aetcd; PostgreSQL: an upsert + an update with asyncpg).

Owns: starting (and always stopping) its own servers: embedded PostgreSQL unless DATABASE_URL is
set (then a fresh database on that server, dropped at the end), embedded etcd unless
ETCD_ENDPOINTS is set, and one `python -m lockservice serve` subprocess per backend.
Must never: assert anything (it reports), or leave a process behind.
Prints progress, then as its LAST line exactly one JSON object with p50/p99/floor per backend.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from lockservice.client import LockClient
from lockservice.grants import generate_keypair
from payouts.embedded import EmbeddedEtcd, EmbeddedPostgres, free_port
from payouts.pgutil import create_database, drop_database

WARMUP = 100


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3), "p99_ms": round(p99 * 1000, 3)}


async def _timed(n: int, op: Callable[[], Awaitable[None]]) -> list[float]:
    for _ in range(WARMUP):
        await op()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await op()
        out.append(time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------- floors


async def etcd_floor(endpoints: list[str], n: int) -> list[float]:
    """One compare-and-put txn (attached to a lease) plus one delete: the least an acquire and a
    release can cost on etcd."""
    import aetcd

    host, port = endpoints[0].rsplit(":", 1)
    client = aetcd.Client(host=host, port=int(port))
    await client.connect()
    try:
        lease = await client.lease(30)
        key = f"bench-floor/{uuid.uuid4().hex}".encode()
        t = client.transactions

        async def op() -> None:
            ok, _ = await client.transaction(
                compare=[t.create(key) == 0], success=[t.put(key, b"s", lease=lease)], failure=[]
            )
            assert ok
            await client.delete(key)

        samples = await _timed(n, op)
        await client.revoke_lease(lease.id)
        return samples
    finally:
        await client.close()


async def postgres_floor(database_url: str, n: int) -> list[float]:
    """An upsert that grants and bumps a per-key counter, plus a compare-and-clear release:
    the statement pair an acquire+release needs at minimum, each its own autocommit."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "CREATE TEMP TABLE bench_floor (key text PRIMARY KEY, counter bigint NOT NULL,"
            " holder text)"
        )
        key = f"bench-floor/{uuid.uuid4().hex}"
        grant = await conn.prepare(
            "INSERT INTO bench_floor AS f (key, counter, holder) VALUES ($1, 1, $2)"
            " ON CONFLICT (key) DO UPDATE SET counter = f.counter + 1, holder = $2"
            " WHERE f.holder IS NULL RETURNING counter"
        )
        release = await conn.prepare(
            "UPDATE bench_floor SET holder = NULL WHERE key = $1 AND holder = $2 AND counter = $3"
        )

        async def op() -> None:
            token = await grant.fetchval(key, "s")
            assert token is not None
            await release.fetch(key, "s", token)

        return await _timed(n, op)
    finally:
        await conn.close()


# --------------------------------------------------------------------------- through the server


@contextlib.asynccontextmanager
async def lock_server(env: dict[str, str], log: Path) -> AsyncIterator[str]:
    """A `python -m lockservice serve` subprocess on a free port; terminated on exit."""
    port = free_port()
    keys = generate_keypair(log.parent / "keys", "bench-k1")  # every grant is signed
    full_env = {
        **os.environ,
        "LOCK_SIGNING_KEY_PATH": str(keys.private_path),
        "LOCK_SIGNING_KEY_ID": keys.kid,
        **env,
        "LOCK_PORT": str(port),
        "LOCK_HOST": "127.0.0.1",
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(  # noqa: ASYNC220 - start-up, outside the measured loop
            [sys.executable, "-m", "lockservice", "serve"], env=full_env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(300):
                if proc.poll() is not None:
                    raise RuntimeError(f"lock server exited early; see {log}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/livez")).json().get("status") == "ok":
                        break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"lock server did not become healthy; see {log}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def through_server(url: str, n: int) -> list[float]:
    async with LockClient(url) as locks:
        key = f"bench:{uuid.uuid4().hex[:12]}"

        async def op() -> None:
            lease = await locks.acquire(key)
            await locks.release(lease)

        return await _timed(n, op)


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
async def _postgres(work: Path) -> AsyncIterator[str]:
    server_url = os.environ.get("DATABASE_URL")
    embedded = None
    if not server_url:
        embedded = EmbeddedPostgres(data_dir=work / "pg")
        server_url = await asyncio.to_thread(embedded.start)
    try:
        db = await create_database(server_url, prefix="lockbench")
        try:
            yield db
        finally:
            await drop_database(server_url, db)
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop, "immediate")


async def run(n: int) -> dict[str, Any]:
    result: dict[str, Any] = {"n": n}
    with tempfile.TemporaryDirectory(prefix="lockbench-") as d:
        work = Path(d)
        # The embedded PostgreSQL runs as an unprivileged user under root.
        work.chmod(0o755)  # noqa: ASYNC240 - start-up, outside the measured loop
        print(f"work dir {work}; n={n} (+{WARMUP} warm-up) per measurement", flush=True)
        async with _postgres(work) as db:
            with _etcd(work) as endpoints:
                prefix = f"bench{uuid.uuid4().hex[:8]}/"
                env = {
                    "etcd": {"LOCK_BACKEND": "etcd", "ETCD_ENDPOINTS": ",".join(endpoints)},
                    "postgres": {"LOCK_BACKEND": "postgres", "DATABASE_URL": db},
                }
                floors: dict[str, Callable[[], Awaitable[list[float]]]] = {
                    "etcd": lambda: etcd_floor(endpoints, n),
                    "postgres": lambda: postgres_floor(db, n),
                }
                for kind in ("etcd", "postgres"):
                    print(f"{kind}: starting lock server", flush=True)
                    server_env = {**env[kind], "LOCK_KEY_PREFIX": prefix}
                    async with lock_server(server_env, work / f"server-{kind}.log") as url:
                        print(f"{kind}: SDK -> {url} -> backend ...", flush=True)
                        stats = _ms(await through_server(url, n))
                    print(f"{kind}: floor (raw backend ops) ...", flush=True)
                    floor = _ms(await floors[kind]())
                    stats["floor_p50_ms"] = floor["p50_ms"]
                    stats["floor_p99_ms"] = floor["p99_ms"]
                    print(f"{kind}: {stats}", flush=True)
                    result[kind] = stats
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockservice.bench", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="acquire+release pairs per backend")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.n))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
