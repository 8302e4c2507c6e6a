"""What the operator-command tests (test_operator_commands_*.py) share: the rail stub's RULES, an
ambiguous payout started and waited for, its status polled until it holds, the real `temporal`
CLI and `payouts` console script run as an operator runs them, and a payout's audit details."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities import models as m
from stack.embedded.temporal import temporal_binary
from tests.credentials import OPERATOR, token_file
from tests.workflows.integration import ids, start
from tests.workflows.system import System, audit_rows, create_payout, fund, wait_for
from workflows.payout import PayoutWorkflow

RULES = [{"reference_prefix": "amb-", "action": "ambiguous"}]
Handle = WorkflowHandle[PayoutWorkflow, m.PayoutStatus]
PAYOUTS = Path(sys.executable).parent / "payouts"  # the console script, as installed


async def ambiguous(
    temporal_env: WorkflowEnvironment, system: System, queue: str, **kw: float
) -> tuple[str, str, Handle]:
    payout_id, account_id = ids("amb-")
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 700)
    handle = await start(temporal_env.client, queue, payout_id, account_id, **kw)
    await until(handle, lambda s: s.state == "RAIL_AMBIGUOUS")
    return payout_id, account_id, handle


async def until(handle: Handle, pred: object, timeout_s: float = 60.0) -> m.PayoutStatus:
    last: list[m.PayoutStatus] = []

    async def reached() -> bool:
        last[:] = [await handle.query(PayoutWorkflow.status)]
        return bool(pred(last[0]))  # type: ignore[operator]

    await wait_for(reached, timeout_s=timeout_s)
    return last[0]


async def temporal(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `temporal` CLI, as an operator (or anyone who can reach Temporal) runs it. In a
    thread: the in-process workers answer on this test's event loop."""
    argv = [temporal_binary(), *args, "--address", address]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
    )


async def payouts(system: System, address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `payouts` console script with the operator's token (in a thread, as above)."""
    env = {
        **os.environ,
        "PAYOUTS_OPERATOR_TOKEN_FILE": token_file(OPERATOR),
        "TEMPORAL_ADDRESS": address,
        "LOCK_URL": system.lock_url,
    }
    return await asyncio.to_thread(
        subprocess.run,
        [str(PAYOUTS), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    return temporal_env.client.service_client.config.target_host


async def audit_details(system: System, payout_id: str, action: str) -> list[str]:
    return [str(r["details"]) for r in await audit_rows(system.database_url, payout_id, action)]
