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
- `tls_untraced_*`: through a third lock server, on TLS as the default's (and on PostgreSQL
  through the same TLS front) but with OTEL_SDK_DISABLED=true, and an untraced client: the
  default's gap to the plain server split into `tls_added_p50_ms` and `tracing_added_p50_ms`,
  and `tls_untraced_ratio_to_http_floor`, the ratio with TLS on and tracing off.

Owns: the run and its report; it starts (and always stops) its own servers through
lab.bench.locks_servers: embedded PostgreSQL unless DATABASE_URL is set (then a fresh database
on that server, dropped at the end), embedded etcd unless ETCD_ENDPOINTS is set, and one
`python -m lockservice serve` subprocess per backend; the floors and the interleaved samples
are lab.bench.locks_measure's.
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
import contextlib
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from common import eventloop, tracing
from common.logs import configure_logging
from common.tracefile import read_spans
from lab.bench import locks_ab as bench_locks_ab
from lab.bench.locks_measure import WARMUP, Op, etcd_floor, kind_stats, measure, postgres_floor
from lab.bench.locks_servers import (
    bench_database,
    etcd_endpoints,
    in_process_backend,
    lock_server,
    sync_pair,
)
from lab.stoppable import interrupted, run_stoppable
from stack.pki import StackTLS, issue_stack_tls


def loadavg() -> str:
    """The 1/5/15-minute load averages (Linux), or "" where there are none."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


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
        async with bench_database(work, tls.postgres()) as (db, tls_db):
            with etcd_endpoints(work) as endpoints:
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
                shape = work, provider, tls
                tls_env = {"postgres": {"DATABASE_URL": tls_db}}
                for kind in ("etcd", "postgres"):
                    where = db, endpoints
                    result[kind] = await _one_kind(
                        kind, env[kind], floors[kind], where, n, prefix, shape, tls_env.get(kind)
                    )
                if ab_n:
                    result["ab"] = await _ab(work, db, prefix, tls, ab_n)
                async with sync_pair(work) as sync_db:
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
    """One backend kind: a TLS+traced, a TLS+untraced and a plain+untraced lock server on it,
    its floor and the backend class in process, measured interleaved. `tls_env`: what the TLS
    sides are given instead (the PostgreSQL DSN through the TLS front)."""
    work, provider, tls = run
    print(f"{kind}: starting lock servers (TLS+traced, TLS+untraced, plain+untraced)", flush=True)
    server_env = {**env, "LOCK_KEY_PREFIX": prefix}
    traced_env = {**server_env, tracing.TRACE_DIR_VAR: str(work / "traces"), **(tls_env or {})}
    plain_env = {**server_env, "OTEL_SDK_DISABLED": "true"}
    db, endpoints = where
    async with (
        lock_server(traced_env, work / f"server-{kind}.log", tls) as (url, token, _),
        lock_server(plain_env, work / "untraced" / f"server-{kind}.log") as plain,
        lock_server(
            {**plain_env, **(tls_env or {})}, work / "tls-untraced" / f"server-{kind}.log", tls
        ) as tls_plain,
        floor_cm() as floor,
        in_process_backend(kind, db, endpoints, f"{prefix}direct/") as backend,
    ):
        print(f"{kind}: SDK -> {url} -> backend, and floors", flush=True)
        samples = await measure(
            url, token, floor, backend, n, plain, tls_plain, provider, tls.client_context()
        )
    stats = kind_stats(samples)
    print(f"{kind}: {stats}", flush=True)
    return stats


def table(result: dict[str, Any]) -> str:
    """The figures as a readable table (ms)."""
    cols: tuple[str, ...] = ("p50_ms", "p99_ms", "untraced_p50_ms", "untraced_p99_ms")
    cols += ("tls_untraced_p50_ms",)
    cols += ("http_floor_p50_ms", "http_floor_p99_ms")
    cols += ("floor_p50_ms", "floor_p99_ms", "http_rtt_p50_ms", "backend_p50_ms")
    cols += ("ratio_to_http_floor", "tls_untraced_ratio_to_http_floor")
    widths = {c: max(17, len(c.removesuffix("_ms"))) for c in cols}
    lines = ["backend   " + " ".join(f"{c.removesuffix('_ms'):>{widths[c]}}" for c in cols)]
    for kind in ("etcd", "postgres", SYNC):
        if kind in result:
            row = " ".join(f"{result[kind][c]:>{widths[c]}}" for c in cols)
            lines.append(f"{kind:<9} {row}")
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
    # The workers' loop (common.eventloop): the SDK is measured as the workers run it.
    try:
        result = run_stoppable(run(args.n, args.ab_n), eventloop.run)
    except KeyboardInterrupt:
        return interrupted()
    print(table(result), flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
