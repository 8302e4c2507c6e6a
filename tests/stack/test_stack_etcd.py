"""The real local stack on the etcd lock backend with fencing off: etcd started for the lock
server and mutual TLS end to end, fencing off reaching the proxy and said loudly, a paused
service resumed, and nothing left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from stack import promconfig
from stack.config import StackConfig
from stack.envfile import read_env_file
from stack.system import Stack
from tests.jsonlogs import assert_every_line_json, service_logs
from tests.stack.conftest import acquire_token, assert_all_gone


async def _etcd_is_mutual_tls_end_to_end(stack: Stack, lock_env: Mapping[str, str]) -> None:
    """Issue 27 §1: the embedded etcd answers https only; the lock server (which just granted)
    has its own client certificate, the stack's leader check and Prometheus the stack's, and
    the env file's etcdctl variables reach the member, a documented runbook command as written."""
    assert stack.etcd_endpoints and all(e.startswith("https://") for e in stack.etcd_endpoints)
    assert lock_env["LOCK_ETCD_CA_FILE"] == str(stack.tls_ca_file)
    assert lock_env["LOCK_ETCD_CERT_FILE"].endswith("etcd-client-lock-server.pem")
    assert await stack.etcd_leader() == "m0"
    etcd_job = promconfig.https_jobs(stack)["etcd"]
    assert etcd_job["cert_file"].endswith("etcd-client-stack.pem"), etcd_job
    env = read_env_file(stack.run_dir / "stack.env")
    etcdctl = Path(sys.executable).parent / "etcdctl"
    status = await asyncio.to_thread(
        subprocess.run,
        [str(etcdctl), "endpoint", "status", "-w", "table"],
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert stack.etcd_endpoints[0] in status.stdout


@pytest.mark.slow
async def test_etcd_backend_with_fencing_off_is_wired_and_loud(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    """backend=etcd starts etcd for the lock server; fencing off reaches the proxy and is logged."""
    config = StackConfig.from_env(
        stack_env, run_dir=stack_dir, workers=0, backend="etcd", fencing=False
    )
    lines: list[str] = []
    with capture_logs() as events:
        async with Stack(config, progress=lines.append) as stack:
            pids = {name: info.pid for name, info in stack.processes.items()}
            logs = service_logs(stack)
            assert "etcd" in pids
            assert stack.etcd_endpoints
            async with httpx.AsyncClient(timeout=10) as http:
                proxy = (await http.get(f"{stack.railproxy_url}/health")).json()
            assert proxy["fencing_enforced"] is False
            assert proxy["experiment_mode"] is True  # verified against the stub (FR-29)
            assert proxy["submission_guard_enforced"] is False
            assert await acquire_token(stack, "stack-test:etcd") > 0
            lock_env = stack.launcher.procs["lock-server"].env
            assert lock_env["LOCK_BACKEND"] == "etcd"
            await _etcd_is_mutual_tls_end_to_end(stack, lock_env)

            # A real pause of one service's whole process group, then resumption.
            stack.kill("railstub", signal.SIGSTOP)
            stack.kill("railstub", signal.SIGCONT)
            async with httpx.AsyncClient(timeout=10) as http:
                assert (await http.get(f"{stack.railstub_url}/health")).status_code == 200
    assert any("FENCING IS OFF" in line for line in lines)
    assert any(e["event"] == "stack.fencing_disabled" for e in events)
    assert_all_gone(pids)
    assert_every_line_json(logs)  # after a SIGSTOP and SIGCONT of one of them too
