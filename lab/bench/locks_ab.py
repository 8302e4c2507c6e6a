"""The A/B of `make bench-locks` (issue 30): a hand-written part of the lock path against the
library part it replaced, measured in the same run, in alternating rounds (A B A B ...) so that
load from elsewhere on the shared machine lands on both sides alike.

- `transport`: the SDK (lockservice.sdk.LockClient) on its own keep-alive transport
  (lockservice.sdk.transport.KeepAliveTransport) against httpx's own
  (`httpx.AsyncHTTPTransport`), with the same TLS context (the benchmark's CA) and limits (at
  most 4 idle connections, no cap on open ones), untraced, both to the same TLS lock server. The
  process that differs is the client: this one.

The second lever of issue 30, the PostgreSQL backend's own pool against asyncpg's (the process
that differs: the lock server), was measured here too (commit c09c270, LOCK_PG_POOL) and decided
for asyncpg's Pool (lockservice.server.backends.pgpool), which left nothing to compare.

Per side: the p50/p99 of acquire+release over all its samples, and per round the round's p50 and
the differing process's CPU per acquire+release (lab.bench.cpu.threads_cpu_s: on-CPU nanoseconds of
its threads; CPU is steadier than latency on a busy machine). `spread` is the max - min over
rounds. `hand_written_better_beyond_spread` is true when the hand-written side's worst round
used less CPU per operation than the library side's best round: the only outcome that keeps a
hand-written part (docs/performance.md).
Owns: measuring. Must never: start servers (lab.bench.locks does, through lab.bench.locks_servers,
and stops them), or assert.
"""

from __future__ import annotations

import os
import ssl
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import httpx

from lab.bench.cpu import threads_cpu_s
from lockservice.sdk import KeepAliveTransport, LockClient

WARMUP = 100
ROUNDS = 10


class LockServer(NamedTuple):
    """A running lock server: its address, the worker token it accepts, and its process id."""

    url: str
    token: str
    pid: int


class _Side(NamedTuple):
    name: str
    op: Callable[[], Awaitable[None]]
    cpu_pid: int  # the process whose CPU this side is charged with


def httpx_transport(context: ssl.SSLContext) -> httpx.AsyncHTTPTransport:
    """httpx's own transport with KeepAliveTransport's TLS and limits."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=4)
    return httpx.AsyncHTTPTransport(verify=context, limits=limits)


async def measure_ab(server: LockServer, context: ssl.SSLContext, n: int) -> dict[str, Any]:
    """`n` acquire+release pairs per side, in ROUNDS interleaved rounds."""
    me = os.getpid()
    async with (
        LockClient(server.url, token=server.token, transport=KeepAliveTransport(context)) as ka,
        LockClient(server.url, token=server.token, transport=httpx_transport(context)) as hx,
    ):
        transport = (_Side("keepalive", _pair(ka), me), _Side("httpx", _pair(hx), me))
        rounds = await _rounds(transport, n)
    return {"n": n, "rounds": ROUNDS, "transport": _lever(transport, rounds, "client")}


def _pair(client: LockClient) -> Callable[[], Awaitable[None]]:
    key = f"bench-ab:{uuid.uuid4().hex[:12]}"

    async def op() -> None:
        await client.release(await client.acquire(key))

    return op


Round = tuple[list[float], float]  # latencies (s), CPU seconds of the side's process


async def _rounds(sides: tuple[_Side, ...], n: int) -> dict[str, list[Round]]:
    for side in sides:
        for _ in range(WARMUP):
            await side.op()
    out: dict[str, list[Round]] = {side.name: [] for side in sides}
    per_round = max(1, n // ROUNDS)
    for _ in range(ROUNDS):
        for side in sides:
            samples: list[float] = []
            cpu0 = threads_cpu_s(side.cpu_pid)
            for _ in range(per_round):
                t0 = time.perf_counter()
                await side.op()
                samples.append(time.perf_counter() - t0)
            out[side.name].append((samples, threads_cpu_s(side.cpu_pid) - cpu0))
    return out


def _lever(
    sides: tuple[_Side, _Side], rounds: dict[str, list[Round]], charged: str
) -> dict[str, Any]:
    hand, library = (_side_stats(rounds[s.name]) for s in sides)
    return {
        "cpu_of": charged,
        sides[0].name: hand,
        sides[1].name: library,
        "cpu_diff_ms_per_op": round(library["cpu_ms_per_op"] - hand["cpu_ms_per_op"], 4),
        "p50_diff_ms": round(library["p50_ms"] - hand["p50_ms"], 3),
        "hand_written_better_beyond_spread": max(hand["cpu_rounds"]) < min(library["cpu_rounds"]),
    }


def _side_stats(rounds: list[Round]) -> dict[str, Any]:
    every = sorted(t for samples, _ in rounds for t in samples)
    cpu = [round(1000 * spent / len(samples), 4) for samples, spent in rounds]
    p50s = [round(1000 * statistics.median(samples), 3) for samples, _ in rounds]
    return {
        "p50_ms": round(1000 * statistics.median(every), 3),
        "p99_ms": round(1000 * every[min(len(every) - 1, int(len(every) * 0.99))], 3),
        "p50_spread_ms": round(max(p50s) - min(p50s), 3),
        "cpu_ms_per_op": round(statistics.median(cpu), 4),
        "cpu_spread_ms": round(max(cpu) - min(cpu), 4),
        "cpu_rounds": cpu,
    }


def table(ab: dict[str, Any]) -> str:
    """The A/B as readable lines (ms)."""
    lines = [f"A/B, {ab['n']} acquire+release per side in {ab['rounds']} interleaved rounds:"]
    for lever in ("transport",):
        fig = ab[lever]
        for name, side in fig.items():
            if isinstance(side, dict):
                lines.append(
                    f"  {lever:<9} {name:<9} p50 {side['p50_ms']:>7}"
                    f" (spread {side['p50_spread_ms']})"
                    f"  CPU of the {fig['cpu_of']} {side['cpu_ms_per_op']:>7}/op"
                    f" (spread {side['cpu_spread_ms']})"
                )
        lines.append(
            f"  {lever}: hand-written better beyond the spread: "
            f"{fig['hand_written_better_beyond_spread']}"
        )
    return "\n".join(lines)
