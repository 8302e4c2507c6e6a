"""`payouts up` as a user runs it: Ctrl-C stops everything, taken ports and leftovers are named."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stack.config import (
    LeftoverProcessError,
    Ports,
    PortTakenError,
    StackConfig,
    StackError,
)
from stack.system import Stack
from tests.stack.conftest import assert_all_gone

PAYOUTS = [sys.executable, "-m", "payouts.cli"]


def _pids(output: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"pid (\S+)\s+(\d+)", output)}


@pytest.mark.slow
def test_up_runs_until_sigint_then_stops_every_child(
    stack_env: dict[str, str], stack_dir: Path, external_database_url: str | None
) -> None:
    """`payouts up` prints the addresses, runs until SIGINT, then no recorded pid is alive."""
    env = dict(stack_env)
    if external_database_url:
        env["DATABASE_URL"] = external_database_url
    proc = subprocess.Popen(
        [*PAYOUTS, "up", "--workers", "0", "--run-dir", str(stack_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "press Ctrl-C" in line or time.monotonic() > deadline:
            break
    output = "".join(lines)
    assert "stack is up" in output, output
    assert f"http://127.0.0.1:{env['PAYOUTS_TEMPORAL_UI_PORT']}" in output
    # Ready-to-paste exports for every address a command needs, on the moved ports.
    assert f"export TEMPORAL_ADDRESS=127.0.0.1:{env['PAYOUTS_TEMPORAL_PORT']}" in output
    # TLS is on by default (issue 27): https addresses, and the CA every command verifies with.
    stub = f"https://127.0.0.1:{env['PAYOUTS_RAILSTUB_PORT']}"
    assert f"export RECONCILE_RAIL_ADMIN_URL={stub}" in output
    assert f"export INVARIANTS_RAIL_ADMIN_URL={stub}" in output
    assert f"export LOCK_URL=https://127.0.0.1:{env['PAYOUTS_LOCK_PORT']}" in output
    assert f"export SSL_CERT_FILE={env['PAYOUTS_TLS_CA_DIR']}/ca.pem" in output
    assert "export DATABASE_URL=" in output
    pids = _pids(output)
    assert {"temporal", "lock-server", "railstub", "railproxy"} <= set(pids)
    recorded = json.loads((stack_dir / "stack.json").read_text())["processes"]
    assert {n: p["pid"] for n, p in recorded.items()} == pids

    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, rest
    assert "stack stopped" in rest
    pids["payouts up"] = proc.pid
    assert_all_gone(pids)


def test_taken_port_is_named_with_its_variable_before_anything_starts(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    """A port in use fails `payouts up --check` with the port, the service and the variable."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        env = dict(stack_env, PAYOUTS_TEMPORAL_PORT=str(port))
        result = subprocess.run(
            [*PAYOUTS, "up", "--check", "--workers", "0", "--run-dir", str(stack_dir)],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"port {port} (Temporal) is taken; set PAYOUTS_TEMPORAL_PORT" in result.stderr
    assert not (stack_dir / "pg").exists(), "nothing may start before the port check"
    assert "starting" not in result.stdout


async def test_free_port_passes_the_check_as_negative_control(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    """The same port check accepts a configuration whose ports are all free."""
    stack = Stack(StackConfig.from_env(stack_env, run_dir=stack_dir))
    stack._check_ports()  # raises PortTakenError if any is taken


async def test_two_services_on_one_port_are_refused(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    """Configuring the same port twice is named with the variable to change."""
    env = dict(stack_env, PAYOUTS_RAILPROXY_PORT=stack_env["PAYOUTS_RAILSTUB_PORT"])
    stack = Stack(StackConfig.from_env(env, run_dir=stack_dir))
    with pytest.raises(
        PortTakenError, match="rail stub and rail proxy; set PAYOUTS_RAILPROXY_PORT"
    ):
        await stack.start()


def test_bad_port_variable_is_rejected() -> None:
    """A port variable that is not a port number is named in the error."""
    with pytest.raises(StackError, match="PAYOUTS_LOCK_PORT='x'"):
        Ports.from_env({"PAYOUTS_LOCK_PORT": "x"})
    assert Ports.from_env({"PAYOUTS_LOCK_PORT": "9999"}).lock == 9999


async def test_live_processes_of_an_earlier_run_are_refused(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    """A recorded pid that still runs the recorded command blocks a new stack in that run dir."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    survivor = await asyncio.create_subprocess_exec(*argv)
    try:
        state = {"processes": {"railstub": {"pid": survivor.pid, "cmd": "\0".join(argv)}}}
        (stack_dir / "stack.json").write_text(json.dumps(state))
        stack = Stack(StackConfig.from_env(stack_env, run_dir=stack_dir))
        with pytest.raises(LeftoverProcessError, match=f"railstub pid {survivor.pid}"):
            await stack.start()
    finally:
        survivor.kill()
        await survivor.wait()
    # Negative control: the same record with the process gone does not block (checked up to ports).
    Stack(StackConfig.from_env(stack_env, run_dir=stack_dir))._refuse_leftovers()


@pytest.mark.slow
def test_up_check_with_a_synchronous_standby(stack_env: dict[str, str], stack_dir: Path) -> None:
    """`payouts up --postgres-standby sync --check`: the embedded PostgreSQL starts as a primary
    with a synchronous standby, every process gets the multi-host DSN, and both servers (like
    every other child) are gone after the check."""
    args = ["up", "--workers", "0", "--postgres-standby", "sync", "--check"]
    proc = subprocess.run(
        [*PAYOUTS, *args, "--run-dir", str(stack_dir)],
        check=False,
        env=stack_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert f"127.0.0.1:{stack_env['PAYOUTS_PG_PORT']} with a sync standby" in output, output
    exports = [ln for ln in output.splitlines() if ln.startswith("export DATABASE_URL=")]
    assert exports and "target_session_attrs=read-write" in exports[0], exports
    assert exports[0].count("127.0.0.1:") == 2, exports
    pids = _pids(output)
    assert {"postgres", "postgres-standby"} <= set(pids), pids
    assert_all_gone(pids)
