"""FR-29: the experiment switches cannot reach a real rail (issue 12 item 4).

The real entry points run as subprocesses (`python -m railproxy`, `python worker_main.py`): with
an enforcement switch off and no experiment mode they exit non-zero with one stderr line naming
the variable, having started nothing; experiment mode is verified (the proxy asks its rail to
identify itself as the stub, a worker asks its proxy whether it is in experiment mode); with a
verified experiment mode they start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from common.db_roles import RAILPROXY
from common.pgutil import create_database, drop_database
from railproxy import create_app
from railproxy.errors import StartupRefused
from stack.embedded.shared import free_port
from tests.conftest import as_role
from tests.credentials import server_env, token_file
from tests.grants import lock_server_env, public_keys
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, proxy_settings
from tests.servers import ServerThread
from tests.workflows.system import spawn, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PROXY_SWITCHES = [
    "RAILPROXY_ENFORCE_FENCING",
    "RAILPROXY_ENFORCE_SUBMISSION_GUARD",
    "RAILPROXY_VERIFY_GRANTS",
]


@pytest.fixture(scope="module")
async def empty_db(pg_server_url: str) -> AsyncIterator[str]:
    """A database nothing has migrated: a proxy that started anything would leave its schema."""
    url = await create_database(pg_server_url, prefix="fr29_t")
    yield url
    await drop_database(pg_server_url, url)


async def _schemas(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT nspname FROM pg_namespace")
    finally:
        await conn.close()
    return {r["nspname"] for r in rows}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAILPROXY_", "WORKER_"))}
    return subprocess.run(  # a failure detector's bound, not a timing assertion
        [sys.executable, *args],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _proxy_env(db: str, rail_url: str, **env: str) -> dict[str, str]:
    return {
        "RAILPROXY_DATABASE_URL": as_role(db, RAILPROXY),
        "RAILPROXY_RAIL_URL": rail_url,
        "RAILPROXY_PORT": str(free_port()),
        "RAILPROXY_GRANT_PUBLIC_KEYS": public_keys(),
        **server_env("railproxy"),
        **env,
    }


def _refusal(proc: subprocess.CompletedProcess[str], prefix: str) -> str:
    """The process refused: exit 2 and exactly one stderr line, the refusal."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"{prefix}: ") and "refusing to start" in lines[0]
    return lines[0]


# ------------------------------------------------------------------ rail proxy


@pytest.mark.parametrize("switch", PROXY_SWITCHES)
async def test_proxy_switch_off_outside_experiment_mode_refuses_to_start(
    switch: str, empty_db: str, stub: Stub
) -> None:
    """A switch off without RAILPROXY_EXPERIMENT_MODE: exit 2, the variable named, no schema."""
    proc = _run(["-m", "railproxy"], _proxy_env(empty_db, stub.url, **{switch: "false"}))
    line = _refusal(proc, "railproxy")
    assert f"{switch}=false" in line and "RAILPROXY_EXPERIMENT_MODE=true" in line
    assert "railproxy" not in await _schemas(empty_db)  # nothing started: not even migrations


async def test_proxy_experiment_mode_against_another_service_refuses(
    empty_db: str, make_proxy: MakeProxy
) -> None:
    """Experiment mode is verified, not believed: a rail that is not the stub (here another
    HTTP service, which has no /admin/identity) is refused."""
    not_a_stub = await make_proxy()
    env = _proxy_env(
        empty_db,
        not_a_stub.url,
        RAILPROXY_ENFORCE_FENCING="false",
        RAILPROXY_EXPERIMENT_MODE="true",
    )
    line = _refusal(_run(["-m", "railproxy"], env), "railproxy")
    assert "RAILPROXY_EXPERIMENT_MODE=true" in line and "RAILPROXY_ENFORCE_FENCING=false" in line
    assert "is not the rail stub" in line
    assert "railproxy" not in await _schemas(empty_db)


async def test_proxy_experiment_mode_with_no_rail_answering_refuses(
    empty_db: str, closed_port: int
) -> None:
    """An unreachable rail cannot be verified as the stub: refused after the bounded wait."""
    env = _proxy_env(
        empty_db,
        f"http://127.0.0.1:{closed_port}",
        RAILPROXY_ENFORCE_SUBMISSION_GUARD="false",
        RAILPROXY_EXPERIMENT_MODE="true",
        RAILPROXY_EXPERIMENT_VERIFY_S="0.5",
    )
    line = _refusal(_run(["-m", "railproxy"], env), "railproxy")
    assert "could not be verified as the rail stub" in line


async def test_proxy_app_lifespan_refuses_too(empty_db: str, stub: Stub) -> None:
    """Serving `create_app` some other way is guarded as well: its lifespan refuses before the
    migration, naming every switch that is off."""
    settings = proxy_settings(
        empty_db,
        stub.url,
        enforce_fencing=False,
        enforce_submission_guard=False,
        verify_grants=False,
    )
    app = create_app(settings)
    with pytest.raises(StartupRefused) as refused:
        async with app.router.lifespan_context(app):
            pass
    assert all(f"{name}=false" in str(refused.value) for name in PROXY_SWITCHES)
    assert "railproxy" not in await _schemas(empty_db)


async def test_proxy_without_public_keys_refuses_to_start(empty_db: str, stub: Stub) -> None:
    """INV-07's safe default: verification on (the default) and no public keys: exit 2 naming
    RAILPROXY_GRANT_PUBLIC_KEYS, nothing started."""
    env = _proxy_env(empty_db, stub.url)
    del env["RAILPROXY_GRANT_PUBLIC_KEYS"]
    line = _refusal(_run(["-m", "railproxy"], env), "railproxy")
    assert "RAILPROXY_GRANT_PUBLIC_KEYS is not set" in line
    assert "railproxy" not in await _schemas(empty_db)


def test_worker_without_public_keys_refuses_to_start(closed_port: int) -> None:
    """The payment store's verifier needs the public keys: without them the worker refuses."""
    env = _worker_env(f"http://127.0.0.1:{closed_port}")
    del env["WORKER_GRANT_PUBLIC_KEYS"]
    line = _refusal(_run(["worker_main.py"], env), "worker")
    assert "WORKER_GRANT_PUBLIC_KEYS is not set" in line


def test_lock_server_without_signing_key_refuses_to_start(empty_db: str) -> None:
    """A lock server that cannot sign would issue grants nobody can verify: it refuses."""
    env = {"LOCK_BACKEND": "postgres", "LOCK_DATABASE_URL": empty_db, "LOCK_PORT": "1"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOCK_")}
    proc = subprocess.run(  # a failure detector's bound, not a timing assertion
        [sys.executable, "-m", "lockservice", "serve"],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = _refusal(proc, "lock-server")
    assert "LOCK_SIGNING_KEY_PATH is not set" in line


@pytest.fixture
def experiment_proxy(rail_db: str, stub_server: ServerThread, tmp_path: Path) -> Iterator[str]:
    """`python -m railproxy` with both switches off, in experiment mode against the stub."""
    port = free_port()
    env = _proxy_env(
        rail_db,
        stub_server.url,
        RAILPROXY_PORT=str(port),
        RAILPROXY_ENFORCE_FENCING="false",
        RAILPROXY_ENFORCE_SUBMISSION_GUARD="false",
        RAILPROXY_EXPERIMENT_MODE="true",
    )
    log = tmp_path / "railproxy.log"
    proc = spawn(["-m", "railproxy"], env, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", proc, log)
        yield url
    finally:
        stop(proc)


def test_proxy_experiment_mode_against_the_stub_starts(experiment_proxy: str) -> None:
    """Against the stub, experiment mode starts, and /health says so (what workers check)."""
    health = httpx.get(f"{experiment_proxy}/health", timeout=5).json()
    assert health["experiment_mode"] is True
    assert (health["fencing_enforced"], health["submission_guard_enforced"]) == (False, False)


# ------------------------------------------------------------------ worker


def _worker_env(proxy_url: str, **env: str) -> dict[str, str]:
    return {
        "WORKER_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",  # nothing there: never reached
        "WORKER_LOCK_URL": f"http://127.0.0.1:{free_port()}",
        "WORKER_RAILPROXY_URL": proxy_url,
        "WORKER_GRANT_PUBLIC_KEYS": public_keys(),
        "WORKER_TOKEN_FILE": token_file("worker"),
        **env,
    }


def test_worker_fencing_off_outside_experiment_mode_refuses_to_start(closed_port: int) -> None:
    """WORKER_ENFORCE_FENCING=false alone: exit 2 naming it, before Temporal is even dialled."""
    env = _worker_env(f"http://127.0.0.1:{closed_port}", WORKER_ENFORCE_FENCING="false")
    line = _refusal(_run(["worker_main.py"], env), "worker")
    assert "WORKER_ENFORCE_FENCING=false" in line and "WORKER_EXPERIMENT_MODE=true" in line


def test_worker_assertions_off_outside_experiment_mode_refuses_to_start(closed_port: int) -> None:
    """WORKER_VERIFY_OPERATOR_ASSERTIONS=false (abandon on a signal's free-text name) is an
    experiment switch too: exit 2 naming it."""
    env = _worker_env(f"http://127.0.0.1:{closed_port}", WORKER_VERIFY_OPERATOR_ASSERTIONS="false")
    line = _refusal(_run(["worker_main.py"], env), "worker")
    assert "WORKER_VERIFY_OPERATOR_ASSERTIONS=false" in line


async def test_worker_experiment_mode_needs_a_proxy_in_experiment_mode(
    make_proxy: MakeProxy,
) -> None:
    """WORKER_EXPERIMENT_MODE=true is verified at the proxy: a normal proxy is refused."""
    normal = await make_proxy()
    env = _worker_env(normal.url, WORKER_ENFORCE_FENCING="false", WORKER_EXPERIMENT_MODE="true")
    line = _refusal(_run(["worker_main.py"], env), "worker")
    assert "WORKER_EXPERIMENT_MODE=true (with WORKER_ENFORCE_FENCING=false)" in line
    assert "not in experiment mode" in line


@pytest.fixture
async def lock_db(pg_server_url: str) -> AsyncIterator[str]:
    url = await create_database(pg_server_url, prefix="fr29_lock_t")
    yield url
    await drop_database(pg_server_url, url)


def test_worker_experiment_mode_against_an_experiment_proxy_starts(
    experiment_proxy: str, lock_db: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Fencing off in experiment mode, its proxy in verified experiment mode: the worker starts
    (its `worker.started` event says so) and stops cleanly on SIGTERM."""
    lock_port = free_port()
    lock_log = tmp_path / "lock.log"
    lock = spawn(
        ["-m", "lockservice", "serve"],
        {
            "LOCK_BACKEND": "postgres",
            "LOCK_DATABASE_URL": lock_db,
            "LOCK_PORT": str(lock_port),
            **lock_server_env(),
            **server_env("lock-server"),
        },
        lock_log,
    )
    worker_log = tmp_path / "worker.log"
    worker = None
    try:
        wait_healthy(f"http://127.0.0.1:{lock_port}/health", lock, lock_log)
        env = {
            **_worker_env(experiment_proxy, WORKER_ENFORCE_FENCING="false"),
            "WORKER_EXPERIMENT_MODE": "true",
            "WORKER_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
            "WORKER_LOCK_URL": f"http://127.0.0.1:{lock_port}",
            "WORKER_DATABASE_URL": lock_db,
            "WORKER_TASK_QUEUE": f"fr29-{free_port()}",
        }
        worker = spawn(["worker_main.py"], env, worker_log)
        started = _wait_for_event(worker, worker_log, "worker.started")
        assert (started["enforce_fencing"], started["experiment_mode"]) == (False, True)
    finally:
        if worker is not None:
            stop(worker)
        stop(lock)
    assert worker.returncode == 0, worker_log.read_text()[-3000:]


def _wait_for_event(
    proc: subprocess.Popen[bytes], log: Path, name: str, timeout_s: float = 60.0
) -> dict[str, object]:
    """Poll the process's JSON log for an event (bounded: a failure detector, not a timing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if f'"{name}"' in line:
                event: dict[str, object] = json.loads(line)
                if event.get("event") == name:
                    return event
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"no {name} event (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
