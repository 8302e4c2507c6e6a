"""What every embedded server shares: the error it raises, a free loopback port, waiting until a
port listens, and an installed package's folder (where the binaries are)."""

from __future__ import annotations

import importlib.util
import random
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["EmbeddedServerError", "free_port", "package_dir", "port_is_open", "wait_for_port"]


class EmbeddedServerError(RuntimeError):
    """A real server could not be started or stopped; the message names what failed."""


# Below Linux's default ephemeral range (32768-60999): a port picked there for a server could be
# taken as the source port of an outgoing connection before the server binds it (seen in CI).
_LISTEN_PORTS = range(20000, 32000)


#: Ports this process has handed out: a port is free when chosen but bound only later, by the
#: server it was chosen for; two stacks started side by side in one process (a test running two
#: chaos runs at once) must never be given the same one in between.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, outside the ephemeral range,
    and never one this process has handed out before."""
    for _ in range(200):
        port = random.choice(_LISTEN_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # crowded: let the OS choose
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _HANDED_OUT.add(port)
    return port


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_for_port(
    port: int, *, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_is_open(port):
            return
        if proc is not None and proc.poll() is not None:
            raise EmbeddedServerError(
                f"{what} exited with code {proc.returncode} before listening on {port}"
            )
        time.sleep(0.05)
    raise EmbeddedServerError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


def package_dir(package: str) -> Path:
    """An installed package's folder, without importing it (pgserver's import has effects)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(f"package {package} is not installed; run `make venv`")
    return Path(next(iter(spec.submodule_search_locations)))
