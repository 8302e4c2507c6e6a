"""N rail proxies send the rail no more than ONE Connection's rate and concurrency (issue 26,
STD01-07/08): three `python -m railproxy` processes on one database in front of one
`python -m railstub` process, counted at the stub.

What the stub's movement log proves, and why no timing luck is involved:
* concurrency: the stub records an instruction when it receives it and answers it after its
  (fixed) latency, so each movement's [recorded_at, settles_at] lies inside the proxy's forward,
  which lies inside the slot the proxy held (taken before the send, freed after the answer).
  The peak overlap of those intervals is therefore at most the number of slots held at once;
* rate: a permit is taken before the send (t <= recorded_at), and every forward of the run was
  answered (asserted), so it arrived before its forward ended, which is at most the forward's
  budget, RAILPROXY_RAIL_TIMEOUT_S, after the take (t >= recorded_at - call_s). The movements
  recorded in any window of W seconds took their permits within W + call_s seconds, and the
  permits admit at most burst + rate * (W + call_s) there. One host, one clock: the database's
  clock_timestamp() and the stub's time.time() are the same clock.

Negative control, the same run with per-process budgets: each proxy its own Connection id, so
each has its own slots and permits, as three processes with local limiters would. The stub then
sees up to three times the concurrency and the rate, by construction (every proxy keeps its own
slots full), and both bounds fail.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg
import httpx
import pytest

from common.db_roles import RAILPROXY
from railproxy import RailProxyClient
from stack.embedded.shared import free_port
from tests.conftest import as_role
from tests.credentials import headers, server_env, token
from tests.grants import public_keys
from tests.railproxy.conftest import submit_request
from tests.workflows.system import spawn, stop, wait_healthy

REPLICAS = 3
MAX_CONCURRENCY = 3
RATE_PER_S = 4.0
BURST = 2
CALL_S = 2.0  # RAILPROXY_RAIL_TIMEOUT_S: the longest forward, hence a permit's furthest arrival
LATENCY_MS = 800  # 3 slots / 0.8 s = 3.75/s: both limits bind on the Connection
WINDOW_S = 4.0
LOAD_S = 8.0
CLIENTS_PER_REPLICA = 2 * MAX_CONCURRENCY
REJECTED_PAUSE_S = 0.2  # a refused client tries again after this (the workflow backs off too)


@dataclass
class Run:
    """What the stub received during one load run, and what the proxies answered."""

    movements: list[tuple[float, float]]  # (recorded_at, settles_at), epoch seconds
    answers: dict[str, int]
    replica_ids: dict[str, int]  # attempts recorded per replica id
    pids: list[int]

    def peak_concurrency(self) -> int:
        """The largest number of movements in progress at the stub at one instant."""
        edges = sorted(
            [(start, 1) for start, _ in self.movements] + [(end, -1) for _, end in self.movements]
        )  # at a tie an end (-1) sorts first: [start, end) intervals
        peak = current = 0
        for _, step in edges:
            current += step
            peak = max(peak, current)
        return peak

    def max_in_window(self, window_s: float) -> int:
        """The most movements the stub received within any `window_s` seconds."""
        starts = sorted(start for start, _ in self.movements)
        best = lo = 0
        for hi, at in enumerate(starts):
            while starts[lo] <= at - window_s:
                lo += 1
            best = max(best, hi - lo + 1)
        return best


@pytest.fixture(scope="module")
def stub_process(run_dir: Path) -> Iterator[str]:
    """`python -m railstub` as its own process: fixed latency, every instruction settled."""
    port = free_port()
    log = run_dir / f"replicas-railstub-{port}.log"
    proc = spawn(
        ["-m", "railstub"],
        {
            "RAILSTUB_PORT": str(port),
            "RAILSTUB_LATENCY_MODE": "fixed",
            "RAILSTUB_LATENCY_FIXED_MS": str(LATENCY_MS),
            "RAILSTUB_AMBIGUITY_RATE": "0",
            "RAILSTUB_LOG_LEVEL": "WARNING",
            **server_env("railstub"),
        },
        log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", proc, log)
        yield url
    finally:
        stop(proc)


def _start_proxies(
    rail_db: str, stub_url: str, connection_ids: list[str], run_dir: Path
) -> list[tuple[subprocess.Popen[bytes], str]]:
    """One `python -m railproxy` per Connection id given (the same id = one shared budget)."""
    started: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    for connection_id in connection_ids:
        port = free_port()
        log = run_dir / f"replicas-railproxy-{port}.log"
        env = {
            "RAILPROXY_DATABASE_URL": as_role(rail_db, RAILPROXY),
            "RAILPROXY_RAIL_URL": stub_url,
            "RAILPROXY_PORT": str(port),
            "RAILPROXY_GRANT_PUBLIC_KEYS": public_keys(),
            "RAILPROXY_CONNECTION_ID": connection_id,
            "RAILPROXY_MAX_CONCURRENCY": str(MAX_CONCURRENCY),
            "RAILPROXY_MAX_QUEUE": str(4 * CLIENTS_PER_REPLICA),
            "RAILPROXY_RATE_PER_S": str(RATE_PER_S),
            "RAILPROXY_RATE_BURST": str(BURST),
            "RAILPROXY_RAIL_TIMEOUT_S": str(CALL_S),
            "RAILPROXY_DB_POOL_MAX": "4",
            "RAILPROXY_LOG_LEVEL": "WARNING",
            **server_env("railproxy"),
        }
        started.append((spawn(["-m", "railproxy"], env, log), f"http://127.0.0.1:{port}", log))
    for proc, url, log in started:
        wait_healthy(f"{url}/health", proc, log)
    return [(proc, url) for proc, url, _ in started]


async def _client_loop(client: RailProxyClient, until: float, prefix: str) -> list[str]:
    answers: list[str] = []
    while time.monotonic() < until:
        req = submit_request(reference=f"{prefix}-{uuid.uuid4().hex[:12]}", deadline_s=5.0)
        result = await client.submit(req)
        answers.append(result.code or str(result.outcome))
        if result.rejected:
            await asyncio.sleep(REJECTED_PAUSE_S)
    return answers


async def _until_acked(client: RailProxyClient, prefix: str) -> list[str]:
    """Submit through one proxy, trying again while the shared budget refuses it, until it is
    forwarded (any answer that is not a refusal ends the loop; the test checks the answers)."""
    answers: list[str] = []
    while True:
        req = submit_request(reference=f"{prefix}-{uuid.uuid4().hex[:12]}", deadline_s=5.0)
        result = await client.submit(req)
        answers.append(result.code or str(result.outcome))
        if not result.rejected:
            return answers
        await asyncio.sleep(REJECTED_PAUSE_S)


async def _run(rail_db: str, stub_url: str, connection_ids: list[str], run_dir: Path) -> Run:
    """Start the proxies, load every one of them for LOAD_S, and read what the stub received."""
    prefix = f"rep-{uuid.uuid4().hex[:8]}"
    procs = _start_proxies(rail_db, stub_url, connection_ids, run_dir)
    clients = [RailProxyClient(url, token=token("worker")) for _, url in procs]
    try:
        until = time.monotonic() + LOAD_S
        loops = [
            _client_loop(client, until, prefix)
            for client in clients
            for _ in range(CLIENTS_PER_REPLICA)
        ]
        answers = [a for loop in await asyncio.gather(*loops) for a in loop]
        # Under load a replica may lose every race for a permit; one quiet submission through
        # each afterwards makes every replica forward at least once, by construction.
        for client in clients:
            answers += await _until_acked(client, prefix)
    finally:
        for client in clients:
            await client.aclose()
        for proc, _ in procs:
            stop(proc)
    async with httpx.AsyncClient(base_url=stub_url, headers=headers(), timeout=30) as http:
        movements = (await http.get("/admin/movements")).json()["movements"]
    conn = await asyncpg.connect(rail_db)
    try:
        rows = await conn.fetch(
            "SELECT replica_id, count(*) AS n FROM railproxy.attempts"
            " WHERE connection_id = ANY($1::text[]) AND client_reference LIKE $2"
            " GROUP BY replica_id",
            connection_ids,
            f"{prefix}-%",
        )
    finally:
        await conn.close()
    mine = [m for m in movements if m["client_reference"].startswith(prefix)]
    return Run(
        movements=[
            (
                datetime.fromisoformat(m["recorded_at"]).timestamp(),
                datetime.fromisoformat(m["settles_at"]).timestamp(),
            )
            for m in mine
        ],
        answers={a: answers.count(a) for a in set(answers)},
        replica_ids={r["replica_id"]: r["n"] for r in rows},
        pids=[proc.pid for proc, _ in procs],
    )


def _report(mode: str, run: Run) -> tuple[int, int]:
    """Print the figures (one JSON line); returns (peak concurrency, most in one window)."""
    peak, in_window = run.peak_concurrency(), run.max_in_window(WINDOW_S)
    figures = {
        "bench": "railproxy_replicas",
        "mode": mode,
        "replicas": REPLICAS,
        "movements": len(run.movements),
        "peak_concurrency": peak,
        "max_concurrency": MAX_CONCURRENCY,
        "window_s": WINDOW_S,
        "max_in_window": in_window,
        "window_bound": _window_bound(),
        "answers": run.answers,
    }
    print(json.dumps(figures, sort_keys=True))
    return peak, in_window


def _window_bound() -> int:
    return int(BURST + RATE_PER_S * (WINDOW_S + CALL_S))


async def test_replicas_share_one_connection_budget(
    rail_db: str, stub_process: str, run_dir: Path
) -> None:
    """Three proxies of one Connection: the stub never sees more than its concurrency or its rate
    (over any 4 s window), and each attempt names the replica (host:pid) that forwarded it."""
    connection = f"rail-rep-{uuid.uuid4().hex[:8]}"
    run = await _run(rail_db, stub_process, [connection] * REPLICAS, run_dir)
    peak, in_window = _report("shared", run)
    # Every forward was answered (the rate bound rests on it): no UNKNOWN, nothing ambiguous.
    assert set(run.answers) <= {"ACKED", "RATE_LIMITED", "ADMISSION_FULL"}, run.answers
    assert run.answers.get("ACKED", 0) == len(run.movements) > 0
    assert peak <= MAX_CONCURRENCY
    assert in_window <= _window_bound()
    # Each replica forwarded some of them under its own identity (each got a quiet submission).
    host = socket.gethostname()
    assert set(run.replica_ids) == {f"{host}:{pid}" for pid in run.pids}
    assert sum(run.replica_ids.values()) == len(run.movements)


async def test_per_process_budgets_overrun_the_connection(
    rail_db: str, stub_process: str, run_dir: Path
) -> None:
    """Negative control: the same load with a budget per process (each proxy its own Connection
    id) -- the stub sees more than the Connection's concurrency and more than its rate bound."""
    ids = [f"rail-own-{uuid.uuid4().hex[:8]}" for _ in range(REPLICAS)]
    run = await _run(rail_db, stub_process, ids, run_dir)
    peak, in_window = _report("per_process", run)
    assert peak > MAX_CONCURRENCY
    assert in_window > _window_bound()
