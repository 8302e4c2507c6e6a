"""One child process of the local stack: started in its own process group, stopped for good.

Owns: starting a command with its log file, waiting for its health check, and stopping its whole
process group (SIGTERM, then SIGKILL after a grace period). Must never: leave a process behind,
or signal anything outside the group it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from stack.config import ServiceFailedError

#: An async probe: True when the service answers as healthy.
HealthCheck = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class ProcessInfo:
    """One running process of the stack, as `Stack.processes` reports it."""

    name: str
    pid: int
    log_path: Path
    url: str | None = None
    #: A worker's Temporal SDK metrics (PayoutWorkflow's end-to-end latency histogram).
    sdk_metrics_url: str | None = None


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie.

    A zombie has already exited; it only waits for its parent to read its status (the stack
    reaps its own children, but a daemonised PostgreSQL is reaped by PID 1, which in some
    containers never does it), so it counts as gone.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def http_check(
    url: str, *, json_status: str | None = None, verify: ssl.SSLContext | bool = True
) -> HealthCheck:
    """Healthy when GET url answers 2xx (and, if given, its JSON `status` field equals it);
    an https url's server is verified against `verify`."""

    async def check() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2.0, verify=verify) as http:
                resp = await http.get(url)
        except httpx.HTTPError:
            return False
        if not resp.is_success:
            return False
        if json_status is None:
            return True
        try:
            return bool(resp.json().get("status") == json_status)
        except ValueError:
            return False

    return check


def tcp_check(port: int, host: str = "127.0.0.1") -> HealthCheck:
    async def check() -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    return check


def command_check(argv: Sequence[str]) -> HealthCheck:
    """Healthy when the command exits 0 (e.g. `temporal operator cluster health`)."""

    async def check() -> bool:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            return await asyncio.wait_for(proc.wait(), 5.0) == 0
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return False

    return check


#: The event a child's log begins with, each time the stack starts it (restarts included).
STARTED_EVENT = "stack.process.started"


def start_marker(name: str, argv: Sequence[str]) -> str:
    """The JSON line written to a child's log before the child starts: which service and which
    command, shaped as every other event (common.logs: `event`, `component`, `level`, `ts`)."""
    event = {
        "argv": list(argv),
        "component": "stack",
        "event": STARTED_EVENT,
        "level": "info",
        "service": name,
        "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    return json.dumps(event, sort_keys=True) + "\n"


@dataclass
class ManagedProcess:
    """A child process of the stack. `pid` is also its process-group id (start_new_session)."""

    name: str
    argv: list[str]
    env: Mapping[str, str]
    log_path: Path
    health: HealthCheck
    health_what: str  # how health is checked, for error messages
    cwd: Path | None = None
    url: str | None = None
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # The log's every line is JSON (common.logs), this marker included: `jq` reads it whole.
            log.write(start_marker(self.name, self.argv).encode())
            log.flush()
            # Its own session: a terminal's Ctrl-C reaches only `payouts up`, which then stops
            # the children in order; and the whole group can be paused or killed at once.
            self.proc = subprocess.Popen(
                self.argv,
                env=dict(self.env),
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    async def wait_healthy(self, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceFailedError(
                    f"{self.name} exited with code {self.proc.returncode} before it was healthy; "
                    f"see its log {self.log_path}\n{log_tail(self.log_path)}"
                )
            if await self.health():
                return
            if time.monotonic() > deadline:
                raise ServiceFailedError(
                    f"{self.name} was not healthy within {within_s:.0f}s ({self.health_what}); "
                    f"see its log {self.log_path}\n{log_tail(self.log_path)}"
                )
            await asyncio.sleep(0.1)

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, SIGKILL it after `grace_s`; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            # A paused (SIGSTOP) process only acts on SIGTERM once it runs again.
            self.signal_group(signal.SIGCONT)
            deadline = time.monotonic() + grace_s
            # Popen offers no awaitable exit; polling a child's status is cheap and bounded.
            while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        # Also sweeps any grandchild left in the group after the leader exited.
        self.signal_group(signal.SIGKILL)
        while proc.poll() is None:  # noqa: ASYNC110 - same: SIGKILL ends it within moments
            await asyncio.sleep(0.02)
        return proc.returncode
