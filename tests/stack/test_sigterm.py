"""Long commands stop their whole stack on SIGTERM and SIGHUP, as `payouts up` does on Ctrl-C.

Python's default SIGTERM handling ended `payouts-lab demo` at once and left ten processes running
(PostgreSQL, Temporal, the lock server, rail services, workers). Here the real command runs until
its stack has written `stack.json` (addresses and pids), gets the signal, and then none of the
recorded processes may be alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.stack.conftest import assert_all_gone

LAB = [sys.executable, "-m", "lab"]


def _wait_for_workers(
    run_dir: Path, proc: subprocess.Popen[str], timeout_s: float
) -> dict[str, int]:
    """The pids a stack under `run_dir` recorded, once its workers are among them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the command ended before its stack was up"
        for stack_json in run_dir.glob("**/stack.json"):
            try:
                procs = json.loads(stack_json.read_text())["processes"]
            except (ValueError, KeyError):  # being written
                continue
            pids = {name: int(p["pid"]) for name, p in procs.items()}
            if any(name.startswith("worker") for name in pids):
                return pids
        time.sleep(0.5)
    raise AssertionError(f"no workers recorded in {stack_json} after {timeout_s}s")


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP): state T in /proc/PID/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def _stopped_once_up(
    argv: list[str], env: dict[str, str], stack_dir: Path, signum: signal.Signals
) -> None:
    """Run `argv` until its stack under `stack_dir` has workers, send `signum`, and assert that
    it exits 130, says every process was stopped, and left none of its stack's processes."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        pids = _wait_for_workers(stack_dir, proc, timeout_s=180)
        os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "every process was stopped" in err
    assert_all_gone(pids)


@pytest.mark.slow
def test_chaos_stops_every_child_even_a_frozen_worker(
    stack_env: dict[str, str],
    stack_dir: Path,
    external_database_url: str | None,
) -> None:
    """`payouts-lab chaos` gets SIGTERM while its armed pause holds a worker SIGSTOPped: it exits 130
    and no process of its stack survives, the frozen worker included."""
    env = dict(stack_env)
    if external_database_url:
        env["DATABASE_URL"] = external_database_url
    argv = [*LAB, "chaos", "--payouts", "40", "--accounts", "5", "--workers", "2"]
    proc = subprocess.Popen(
        [*argv, "--seed", "11", "--run-dir", str(stack_dir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = _wait_for_workers(stack_dir, proc, timeout_s=180)
        deadline = time.monotonic() + 150
        while not any(_stopped(pid) for pid in pids.values()):
            assert time.monotonic() < deadline, "the armed pause never froze a worker"
            assert proc.poll() is None
            time.sleep(0.5)
            pids = _wait_for_workers(stack_dir, proc, timeout_s=30)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert_all_gone(pids)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_demo_stops_every_child_on_signal(
    signum: signal.Signals,
    stack_env: dict[str, str],
    stack_dir: Path,
    external_database_url: str | None,
) -> None:
    """`payouts-lab demo` killed by SIGTERM/SIGHUP mid-run exits 130 with no process of its stack
    left alive."""
    env = dict(stack_env)
    if external_database_url:
        env["DATABASE_URL"] = external_database_url
    argv = [*LAB, "demo", "--payouts", "400", "--accounts", "5", "--workers", "1"]
    _stopped_once_up([*argv, "--no-pause", "--run-dir", str(stack_dir)], env, stack_dir, signum)


@pytest.mark.slow
def test_bench_e2e_stops_every_child_on_sigterm(
    stack_env: dict[str, str],
    stack_dir: Path,
    external_database_url: str | None,
) -> None:
    """`make bench-e2e` stopped by SIGTERM (a CI runner's timeout) once its traced stack is up:
    it exits 130 and no process of that stack survives. Before, Python's default handling ended
    the bench at once and left the stack running."""
    env = dict(stack_env)
    if external_database_url:
        env["DATABASE_URL"] = external_database_url
    argv = [sys.executable, "-m", "lab.bench.e2e", "--n", "3", "--rounds", "1", "--workers", "1"]
    argv += ["--hot-n", "0", "--locks-n", "0", "--no-takeover", "--no-untraced"]
    _stopped_once_up([*argv, "--run-dir", str(stack_dir)], env, stack_dir, signal.SIGTERM)
