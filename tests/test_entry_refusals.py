"""Every process entry point refuses a credentials, key or token file it cannot use the same way:
one line on stderr naming the variable and the file, exit 2, before anything has started.

The real entry points run as subprocesses. Every other setting they need points at a closed
port, so a process that got past its check and started anything (a migration, a pool, a
Temporal connection, a port) would fail there instead: with another exit code, or with more
than one line on stderr (a traceback, a JSON log event).

The unreadable case (mode 000) only blocks a process that is not root; as root it is skipped,
and a directory in the file's place covers "cannot be read" for every variable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import httpx
import pytest

from stack.embedded.shared import free_port
from tests.credentials import server_env, token_file
from tests.grants import lock_server_env, public_keys

ROOT = Path(__file__).resolve().parents[1]
_PREFIXES = (
    "LOCK_",
    "RAILPROXY_",
    "RAILSTUB_",
    "FINLEDGER_",
    "WORKER_",
    "OUTBOX_",
    "RECONCILE_",
    "INVARIANTS_",
    "CHECKER_",
    "PAYOUTS_",
    "TEMPORAL_TLS",  # the Temporal CLI's TLS variables, which the workers read too
)
_PAYOUTS_CLI = ["-m", "payouts.cli"]


def _nowhere() -> str:
    """A DSN nothing listens on: any process that started would fail on it, not refuse."""
    return f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"


def _lock_server() -> dict[str, str]:
    return {
        **lock_server_env(),
        **server_env("lock-server"),
        "LOCK_PORT": str(free_port()),
        "LOCK_DATABASE_URL": _nowhere(),
    }


def _railproxy() -> dict[str, str]:
    return {
        **server_env("railproxy"),
        "RAILPROXY_GRANT_PUBLIC_KEYS": public_keys(),
        "RAILPROXY_PORT": str(free_port()),
        "RAILPROXY_DATABASE_URL": _nowhere(),
        "RAILPROXY_RAIL_URL": f"http://127.0.0.1:{free_port()}",
    }


def _worker() -> dict[str, str]:
    return {
        "WORKER_GRANT_PUBLIC_KEYS": public_keys(),
        "WORKER_TOKEN_FILE": token_file("worker"),
        "RECONCILE_TOKEN_FILE": token_file("reconciler"),
        "WORKER_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "WORKER_DATABASE_URL": _nowhere(),
    }


#: (process, its command, its otherwise good environment, the prefix of its refusal line)
ENTRIES: dict[str, tuple[list[str], Callable[[], dict[str, str]], str]] = {
    "lock-server": (["-m", "lockservice", "serve"], _lock_server, "lock-server: "),
    "railstub": (
        ["-m", "railstub"],
        lambda: {**server_env("railstub"), "RAILSTUB_PORT": str(free_port())},
        "railstub: ",
    ),
    "finledger": (
        ["-m", "finledger"],
        lambda: {**server_env("finledger"), "FINLEDGER_PORT": str(free_port())},
        "finledger: ",
    ),
    "railproxy": (["-m", "railproxy"], _railproxy, "railproxy: "),
    "worker": (["worker_main.py"], _worker, "worker: "),
    "outbox": (
        [*_PAYOUTS_CLI, "outbox", "run"],
        lambda: {"OUTBOX_TOKEN_FILE": token_file("outbox"), "OUTBOX_DATABASE_URL": _nowhere()},
        "outbox: ",
    ),
    # the same publisher as the local stack starts it
    "outbox-module": (
        ["-m", "outbox"],
        lambda: {"OUTBOX_TOKEN_FILE": token_file("outbox"), "OUTBOX_DATABASE_URL": _nowhere()},
        "outbox: ",
    ),
    "invariants": (
        [*_PAYOUTS_CLI, "check-invariants", "--no-workflows"],
        lambda: {"INVARIANTS_TOKEN_FILE": token_file("invariants"), "DATABASE_URL": _nowhere()},
        "error: ",
    ),
    "reconcile": (
        [*_PAYOUTS_CLI, "reconcile", "run"],
        lambda: {"RECONCILE_TOKEN_FILE": token_file("reconciler"), "DATABASE_URL": _nowhere()},
        "error: ",
    ),
}


def _bad_file(kind: str, where: Path) -> Path:
    """A file in the place of a credentials, key or token file that no process can use."""
    path = where / f"bad-{kind}"
    if kind == "directory":
        path.mkdir()
    elif kind == "missing":
        pass
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00garbage\x80")
    elif kind == "not-json":
        path.write_text('{"credentials": [')
    elif kind == "empty":
        path.write_text("")
    elif kind == "unreadable":
        path.write_text("secret\n")
    else:
        raise AssertionError(kind)
    if path.exists() and not path.is_dir():
        path.chmod(0o000 if kind == "unreadable" else 0o600)
    return path


CASES = [
    ("lock-server", "LOCK_CREDENTIALS_PATH", "directory"),
    ("lock-server", "LOCK_CREDENTIALS_PATH", "missing"),
    ("lock-server", "LOCK_CREDENTIALS_PATH", "not-utf8"),
    ("lock-server", "LOCK_CREDENTIALS_PATH", "not-json"),
    ("lock-server", "LOCK_CREDENTIALS_PATH", "unreadable"),
    ("lock-server", "LOCK_SIGNING_KEY_PATH", "directory"),
    ("lock-server", "LOCK_SIGNING_KEY_PATH", "missing"),
    ("lock-server", "LOCK_SIGNING_KEY_PATH", "not-utf8"),
    ("lock-server", "LOCK_SIGNING_KEY_PATH", "unreadable"),
    ("railstub", "RAILSTUB_CREDENTIALS_PATH", "directory"),
    ("railstub", "RAILSTUB_CREDENTIALS_PATH", "not-utf8"),
    ("finledger", "FINLEDGER_CREDENTIALS_PATH", "not-json"),
    ("railproxy", "RAILPROXY_CREDENTIALS_PATH", "directory"),
    ("railproxy", "RAILPROXY_TOKEN_FILE", "directory"),
    ("railproxy", "RAILPROXY_TOKEN_FILE", "missing"),
    ("railproxy", "RAILPROXY_TOKEN_FILE", "empty"),
    ("railproxy", "RAILPROXY_TOKEN_FILE", "unreadable"),
    ("worker", "WORKER_TOKEN_FILE", "directory"),
    ("worker", "WORKER_TOKEN_FILE", "not-utf8"),
    ("worker", "RECONCILE_TOKEN_FILE", "missing"),
    ("worker", "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "directory"),
    ("worker", "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "missing"),
    ("outbox", "OUTBOX_TOKEN_FILE", "directory"),
    ("outbox", "OUTBOX_TOKEN_FILE", "missing"),
    ("reconcile", "RECONCILE_TOKEN_FILE", "directory"),
    ("invariants", "INVARIANTS_TOKEN_FILE", "not-utf8"),
]


def _refusal(argv: list[str], env: dict[str, str]) -> str:
    """Run the entry point with `env` over a clean environment; assert it refused (exit 2,
    exactly one stderr line, nothing on stdout) and return that line."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    proc = subprocess.run(  # the timeout is a failure detector's bound, not a timing assertion
        [sys.executable, *argv],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert proc.stdout == ""
    return lines[0]


@pytest.mark.parametrize(("process", "variable", "kind"), CASES)
def test_a_file_that_cannot_be_used_is_one_line_and_exit_2(
    process: str, variable: str, kind: str, tmp_path: Path
) -> None:
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file; the directory case covers 'cannot be read'")
    argv, good_env, prefix = ENTRIES[process]
    bad = _bad_file(kind, tmp_path)
    line = _refusal(argv, good_env() | {variable: str(bad)})
    assert line.startswith(prefix), line
    assert str(bad) in line, line  # which file: the operator's next step
    if prefix != "error: ":  # a service's refusal also names the variable to change
        assert variable in line and "refusing to start" in line, line


#: Entry points that serve without a database: with good files they answer /health.
_SERVING = {"railstub": "RAILSTUB_PORT", "finledger": "FINLEDGER_PORT"}


@pytest.mark.parametrize("process", sorted(ENTRIES))
def test_the_good_environment_gets_past_the_file_checks(process: str) -> None:
    """The control: with every file good, the same command gets past its checks: it serves
    (railstub, finledger) or fails later, at the closed port, naming none of the files. So the
    refusals above are the bad files' and nothing else's."""
    argv, good_env, _ = ENTRIES[process]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    env = clean | good_env()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if process in _SERVING:
            wait_serving(proc, int(env[_SERVING[process]]))
            return
        _, err = proc.communicate(timeout=120)  # a failure detector's bound
        assert proc.returncode != 0, err[-3000:]  # it failed later, on the closed port
        assert not [v for _, v, _ in CASES if v in err], err[-3000:]  # not on a file
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)


def wait_serving(proc: subprocess.Popen[str], port: int) -> None:
    """Until /health answers (any status); fails if the process exits first."""
    deadline = time.monotonic() + 60  # a failure detector, not a timing assertion
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, "never answered /health"
            time.sleep(0.1)


#: A settings value of each service that does not parse (each is an integer or a float field).
BAD_VALUES = [
    ("lock-server", "LOCK_PORT"),
    ("railstub", "RAILSTUB_PORT"),
    ("finledger", "FINLEDGER_PORT"),
    ("railproxy", "RAILPROXY_PORT"),
    ("worker", "WORKER_MAX_CONCURRENT_ACTIVITIES"),
    ("outbox", "OUTBOX_BATCH_SIZE"),
]


@pytest.mark.parametrize(("process", "variable"), BAD_VALUES)
def test_a_value_that_does_not_parse_is_one_line_naming_it_and_exit_2(
    process: str, variable: str
) -> None:
    """`LOCK_PORT=abc` and the like: a refusal naming the variable, not a traceback; the value
    itself is not echoed (another variable's value may be a secret's path or a password)."""
    argv, good_env, prefix = ENTRIES[process]
    line = _refusal(argv, good_env() | {variable: "not-a-number-x7"})
    assert line.startswith(f"{prefix}invalid settings: {variable}: "), line
    assert "not-a-number-x7" not in line


def _corrupt_watermark_dir(where: Path, env: dict[str, str]) -> Path:
    """A LOCK_STATE_DIR holding, for the backend location `env` configures, a watermark file
    that is not JSON (its name is a digest of that location: made by opening it once)."""
    state = where / "state"
    state.mkdir()
    from pydantic import TypeAdapter

    from lockservice.server import LockSettings
    from lockservice.server.watermark import Watermark, location_identity

    # The variable's text validated as LockSettings validates its `backend` field.
    backend = TypeAdapter(Literal["postgres", "etcd"]).validate_python(
        env.get("LOCK_BACKEND", "postgres")
    )
    s = LockSettings(
        backend=backend,
        database_url=env["LOCK_DATABASE_URL"],
        key_prefix=env.get("LOCK_KEY_PREFIX", LockSettings.model_fields["key_prefix"].default),
    )
    identity = location_identity(s.backend, s.key_prefix, s.database_url, s.etcd_endpoint_list())
    Watermark.open(state, identity).path.write_text('{"identity": ')
    return state


@pytest.mark.parametrize("kind", ["a-file", "corrupt-watermark"])
def test_a_state_dir_that_cannot_hold_the_watermark_is_refused_before_the_backend(
    kind: str, tmp_path: Path
) -> None:
    """LOCK_STATE_DIR (restore detection) set to a file, or holding a watermark that is not
    JSON: one refusal line naming it, exit 2, before the backend is connected (its database
    here is a closed port: reaching it would be another failure)."""
    argv, _, prefix = ENTRIES["lock-server"]
    env = _lock_server()
    if kind == "a-file":
        state = tmp_path / "not-a-dir"
        state.write_text("")
    else:
        state = _corrupt_watermark_dir(tmp_path, env)
    line = _refusal(argv, env | {"LOCK_STATE_DIR": str(state)})
    assert line.startswith(f"{prefix}LOCK_STATE_DIR {state}: "), line
    assert "refusing to start" in line


def test_https_etcd_endpoints_without_a_ca_are_refused_before_the_backend() -> None:
    """The lock server on `https://` etcd endpoints without LOCK_ETCD_CA_FILE: one line naming
    the variables, exit 2, before any connection (issue 27 §1: never etcd unverified)."""
    argv, _, prefix = ENTRIES["lock-server"]
    endpoint = f"https://127.0.0.1:{free_port()}"
    env = _lock_server() | {"LOCK_BACKEND": "etcd", "LOCK_ETCD_ENDPOINTS": endpoint}
    line = _refusal(argv, env)
    assert line.startswith(f"{prefix}invalid settings: "), line
    assert "are https:// but LOCK_ETCD_CA_FILE is not set" in line


@pytest.mark.parametrize("process", ["worker", "outbox", "outbox-module"])
def test_an_event_loop_it_does_not_know_is_one_line_and_exit_2(process: str) -> None:
    """PAYOUTS_EVENT_LOOP (common.eventloop) naming neither uvloop nor asyncio: one refusal line
    naming the variable, exit 2, before anything has started; the good-environment control
    above runs the same commands with it unset."""
    argv, good_env, prefix = ENTRIES[process]
    line = _refusal(argv, good_env() | {"PAYOUTS_EVENT_LOOP": "tokio"})
    assert line.startswith(prefix), line
    assert "PAYOUTS_EVENT_LOOP='tokio' is not one of uvloop, asyncio" in line, line
