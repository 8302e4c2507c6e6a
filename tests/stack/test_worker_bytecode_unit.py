"""The stack's workers cache bytecode under the run directory (unit: no stack is started; one
short interpreter imports the workflow module with the worker's Python settings). Why: the
workflow sandbox imports the workflow module afresh for every workflow run, and without a .pyc
(PYTHONDONTWRITEBYTECODE, an editable install) compiles it from source each time."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from stack.config import StackConfig
from stack.service_env import PROJECT_ROOT
from stack.services import ServiceFactory
from tests.stack.test_transfer_rps_unit import ADDRESSES


def test_unit_a_worker_caches_the_workflow_module_bytecode_under_the_run_dir(
    tmp_path: Path,
) -> None:
    addr = dataclasses.replace(
        ADDRESSES,
        role_urls={
            "WORKER_DATABASE_URL": "postgresql://worker@127.0.0.1:1/payments",
            "RECONCILE_DATABASE_URL": "postgresql://reconciler@127.0.0.1:1/payments",
        },
        pgpass_dir=str(tmp_path),
    )
    config = StackConfig.from_env({}, run_dir=tmp_path)
    worker = ServiceFactory(config, addr, {}).worker("worker-1", 1, 2, {})
    python = {k: v for k, v in worker.env.items() if k.startswith("PYTHON")}
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **python}  # as on our machines
    subprocess.run(
        [sys.executable, "-c", "import workflows.payout"], cwd=PROJECT_ROOT, env=env, check=True
    )
    prefix = Path(python["PYTHONPYCACHEPREFIX"])
    assert prefix.is_relative_to(tmp_path)
    assert list(prefix.rglob("workflows/payout.*.pyc"))  # the prefix mirrors the source path
