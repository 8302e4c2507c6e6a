"""Benchmark of PostgreSQL's TLS front (`python -m lab.bench.pgtls`): the front's own CPU per
query (stack.pgtls), on a real embedded server, through 4 asyncpg connections with verify-full,
beside the same queries' wall time. It keeps the measurement that chose the front's protocol
callbacks over a copy loop on streams (docs/performance.md, "PostgreSQL's TLS front").

Must never: assert anything (it reports), or leave a process behind. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from lab.bench.cpu import process_cpu_s
from stack.embedded.postgres import EmbeddedPostgres
from stack.pki import StackPKI

CONNECTIONS = 4


async def _measure(pg: EmbeddedPostgres, n: int) -> dict[str, Any]:
    front = pg.front_pid
    assert front is not None
    conns = [await asyncpg.connect(pg.url) for _ in range(CONNECTIONS)]
    try:
        for conn in conns:  # warm-up: the handshake and the first statement's preparation
            await conn.fetchval("SELECT $1::int", 0)
        cpu_before, started = process_cpu_s(front), time.monotonic()

        async def queries(conn: asyncpg.Connection) -> None:
            for i in range(n // CONNECTIONS):
                await conn.fetchval("SELECT $1::int", i)

        await asyncio.gather(*(queries(c) for c in conns))
        cpu = process_cpu_s(front) - cpu_before
        wall = time.monotonic() - started
    finally:
        for conn in conns:
            await conn.close()
    return {
        "n": n,
        "front_cpu_us_per_query": round(1e6 * cpu / n, 1),
        "wall_us_per_query": round(1e6 * wall / n, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.bench.pgtls", description=__doc__)
    parser.add_argument("--n", type=int, default=8000, help="queries in all")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-pgtls-") as d:
        work = Path(d)
        work.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user under root
        tls = StackPKI(work / "tls").postgres_tls()
        pg = EmbeddedPostgres(data_dir=work / "pg", fast=True, tls=tls)
        pg.start()
        try:
            result = asyncio.run(_measure(pg, args.n))
        finally:
            pg.stop("immediate")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
