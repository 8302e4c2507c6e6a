"""`make bench-locks` (`python -m lab.bench.locks`) run tiny as a real subprocess against the
suite's real PostgreSQL and etcd: it ends with one JSON line carrying, per backend, the figures
and both floors of the same run, and the A/B of the SDK's transport. Figures are never asserted
against a timing (the machine is shared); only that each was measured."""

from __future__ import annotations

import asyncio
import json
import os
import sys

FIGURES: tuple[str, ...]
FIGURES = ("p50_ms", "p99_ms", "floor_p50_ms", "http_floor_p50_ms", "http_rtt_p50_ms")
FIGURES += ("untraced_p50_ms", "untraced_p99_ms")  # tracing off, beside the traced default
FIGURES += ("tls_untraced_p50_ms", "tls_untraced_p99_ms")  # TLS on, tracing off


async def test_bench_locks_prints_both_floors_as_its_last_line(
    pg_server_url: str, etcd_endpoints: list[str]
) -> None:
    env = {**os.environ, "DATABASE_URL": pg_server_url, "ETCD_ENDPOINTS": ",".join(etcd_endpoints)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lab.bench.locks",
        "--n",
        "20",
        "--ab-n",
        "40",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-2000:]
    lines = out.decode().strip().splitlines()
    result = json.loads(lines[-1])
    assert result["n"] == 20
    assert "http_floor_p50" in out.decode()  # the table precedes the JSON line
    for kind in ("etcd", "postgres", "postgres_sync"):  # the last: with a synchronous standby
        stats = result[kind]
        for name in FIGURES:
            assert stats[name] > 0, (kind, name, stats)
        # The HTTP floor contains the raw floor (it runs the same operations plus two trips).
        assert stats["http_floor_p50_ms"] >= stats["http_rtt_p50_ms"]
        assert stats["ratio_to_http_floor"] == round(
            stats["p50_ms"] / stats["http_floor_p50_ms"], 2
        )
        # The default's gap to the plain untraced server, split at the TLS untraced one.
        tls, tracing = stats["tls_added_p50_ms"], stats["tracing_added_p50_ms"]
        gap = stats["p50_ms"] - stats["untraced_p50_ms"]
        assert round(tls + tracing, 3) == round(gap, 3), stats
        assert stats["tls_untraced_ratio_to_http_floor"] == round(
            stats["tls_untraced_p50_ms"] / stats["http_floor_p50_ms"], 2
        )
    # The traced side was traced: at least the client's and the server's span of each pair.
    assert result["traced_spans"] >= 2 * 2 * 20
    assert result["loadavg_before"] and result["loadavg_after"]
    # The A/B of issue 30: each side of the SDK's transport measured, with the client's CPU.
    ab = result["ab"]
    assert ab["n"] == 40 and ab["transport"]["cpu_of"] == "client"
    for side in ("keepalive", "httpx"):
        figures = ab["transport"][side]
        assert figures["p50_ms"] > 0 and figures["cpu_ms_per_op"] > 0, side
        assert len(figures["cpu_rounds"]) == ab["rounds"]
    assert isinstance(ab["transport"]["hand_written_better_beyond_spread"], bool)
    added = result["postgres_sync"]["p50_ms"] - result["postgres"]["p50_ms"]
    assert result["sync_standby_added_p50_ms"] == round(added, 3)
