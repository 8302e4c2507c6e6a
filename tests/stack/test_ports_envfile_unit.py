"""The local stack's ports and environment file, without starting anything.

Every port has one default, in `stack.config.Ports`, and docs/local-stack.md's table says the
same; `0` and `Ports.isolated()` give free ports. The environment file round-trips through a
shell and through `read_env_file`, is private, and refuses lines that are not assignments.
"""

from __future__ import annotations

import re
import socket
import stat
import subprocess
from dataclasses import fields, replace
from pathlib import Path

import pytest

from stack.config import Ports, PortTakenError, StackConfig
from stack.envfile import EnvFileError, read_env_file, render_env_file, write_env_file
from stack.preflight import check_ports

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "local-stack.md"


def test_the_documented_ports_are_the_defaults() -> None:
    rows = re.findall(
        r"^\| `(PAYOUTS_\w+_PORT)` \|.*\| (\d+|a free port) \|$", DOC.read_text(), re.M
    )
    documented = dict(rows)
    defaults = Ports()
    for f in fields(Ports):
        value = getattr(defaults, f.name)
        assert documented[Ports.ENV_VARS[f.name]] == (str(value) if value else "a free port")
    assert len(documented) == len(fields(Ports))


def test_zero_means_a_free_port_and_isolated_ports_are_all_free() -> None:
    ports = Ports.from_env({"PAYOUTS_LOCK_PORT": "0", "PAYOUTS_WORKER_METRICS_PORT": "0"})
    assert ports.lock not in (0, Ports().lock)
    assert ports.worker_metrics_base is None  # each worker its own free port
    iso = Ports.isolated()
    singles = [getattr(iso, f.name) for f in fields(Ports) if not f.name.startswith("worker_")]
    assert len(set(singles)) == len(singles)
    assert not set(singles) & {getattr(Ports(), f.name) for f in fields(Ports)}
    assert iso.worker_metrics_base is None and iso.worker_sdk_metrics_base is None


def test_a_taken_worker_port_is_named_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        ports = replace(Ports.isolated(), worker_metrics_base=taken - 1)
        cfg = StackConfig(
            run_dir=tmp_path, workers=2, database_url="postgresql://x@127.0.0.1:1/x", ports=ports
        )
        with pytest.raises(PortTakenError, match=rf"port {taken} \(worker-2 metrics\) is taken"):
            check_ports(cfg)


def test_the_env_file_round_trips_through_sh_and_python(tmp_path: Path) -> None:
    env = {
        "LOCK_URL": "http://127.0.0.1:8701",
        "WORKER_URLS": "http://127.0.0.1:8800 http://127.0.0.1:8801",
        "ODD": 'it\'s $(not run) `either`; "quoted"',
        "EMPTY": "",
    }
    path = tmp_path / "stack.env"
    write_env_file(path, env, header="a header\nof two lines")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_env_file(path) == env
    shell = subprocess.run(
        ["bash", "-c", f'. {path}; printf "%s\\n" "$ODD" "$WORKER_URLS"'],
        capture_output=True, text=True, check=True, timeout=10, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert shell.stdout.splitlines() == [env["ODD"], env["WORKER_URLS"]]


def test_the_env_file_refuses_anything_but_assignments(tmp_path: Path) -> None:
    path = tmp_path / "stack.env"
    path.write_text("export A=1\nrm -rf /tmp/nothing\n")
    with pytest.raises(EnvFileError, match=r"stack\.env:2"):
        read_env_file(path)
    with pytest.raises(EnvFileError, match="not an environment variable name"):
        render_env_file({"not-a-name": "x"}, header="")
