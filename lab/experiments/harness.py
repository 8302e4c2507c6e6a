"""What every experiment on the real local stack is run with (and the lab's other runs reuse):
short leases and fast workflow timings, an isolated stack's configuration, a payout to run,
waiting for a condition, and a process's kernel state.

Owns: the experiments' settings and the steps that drive a run. Must never: weaken fencing (an
experiment's own `fencing` argument does, for its negative control), or judge a result.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from common.logs import get_logger
from stack.config import Ports, StackConfig
from stack.system import Stack

__all__ = [
    "FAST_WORKFLOW",
    "LOCK_TTL_S",
    "WORKER_ENV",
    "ExperimentError",
    "default_config",
    "isolated_ports",
    "payout_row",
    "prepare_payout",
    "process_state",
    "start_workflow",
    "until",
]

log = get_logger("lab.experiments")

LOCK_TTL_S = 3.0  # short leases so the experiment runs in seconds, not in A-04's 15 s
WORKER_ENV = {"WORKER_LOCK_TTL_S": str(LOCK_TTL_S), "WORKER_LOCK_HEARTBEAT_S": "0.75"}
FAST_WORKFLOW = {
    "acquire_wait_s": 30.0,
    "base_backoff_s": 0.2,
    "max_backoff_s": 1.0,
    "lookup_interval_s": 0.5,
    # Longer than W1's freeze, so that W1's request still has budget when it thaws and reaches
    # the fence check. (A pause past the deadline is refused even earlier, as DEADLINE_EXCEEDED.)
    "submit_deadline_s": 60.0,
    "holder_pickup_s": 3.0,
    "holder_heartbeat_timeout_s": 3.0,
}


class ExperimentError(RuntimeError):
    """The experiment could not run to its end (not: the design failed, which is a result)."""


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 90.0) -> None:
    """Wait until `check()` holds, polling; ExperimentError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise ExperimentError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: 'T' means stopped (SIGSTOP)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


async def payout_row(database_url: str, payout_id: str) -> asyncpg.Record:
    """The payout's state and fence token in the payment database now."""
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchrow(
            "SELECT state, fence FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
    finally:
        await conn.close()


async def prepare_payout(stack: Stack, amount: int, balance: int) -> tuple[str, str]:
    """A funded account of its own and one payout row on it (no workflow yet): (payout, account)."""
    from payouts.batch import PayoutSpec
    from payouts.workload import create_payouts, seed_accounts

    run = uuid.uuid4().hex[:8]
    prefix = f"x{run}-"
    [account_id] = await seed_accounts(stack.role_dsn("PAYDB_DATABASE_URL"), 1, balance, prefix)
    payout_id = f"po-{run}"
    await create_payouts(
        stack.role_dsn("PAYDB_DATABASE_URL"), [PayoutSpec(payout_id, account_id, amount)]
    )
    return payout_id, account_id


async def start_workflow(stack: Stack, payout_id: str, account_id: str) -> None:
    """Start the payout's workflow with the experiments' fast timings (FAST_WORKFLOW)."""
    from payouts.batch import PayoutSpec
    from payouts.workload import start_workflows

    await start_workflows(
        stack.temporal_address,
        stack.config.task_queue,
        [PayoutSpec(payout_id, account_id, 0)],
        **FAST_WORKFLOW,
    )


def isolated_ports() -> Ports:
    """Free ports for every service: an experiment never collides with a running `payouts up`."""
    return Ports.isolated()


def default_config(backend: str, run_dir: Path | None = None) -> StackConfig:
    """An isolated stack's configuration with no workers (the experiment starts its own)."""
    run = run_dir or Path(os.environ.get("PAYOUTS_RUN_DIR", ".run")) / f"exp-{uuid.uuid4().hex[:6]}"
    return StackConfig.from_env(backend=backend, run_dir=run, workers=0, ports=isolated_ports())
