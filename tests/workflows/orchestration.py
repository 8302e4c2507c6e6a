"""The harness of the orchestration tests of PayoutWorkflow with MOCK activities on a real
Temporal dev server (test_payout_orchestration_*.py, test_takeover.py): a MockWorld's workers
(`running`), a payout started with short timings, the status polled until it holds."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import models as m
from tests.workflows.mock_world import MockWorld
from workflows.payout import PayoutWorkflow

FAST = {
    "acquire_wait_s": 0.1,
    "base_backoff_s": 0.05,
    "max_backoff_s": 0.2,
    "lookup_interval_s": 0.2,
    "holder_pickup_s": 1.0,
}


@asynccontextmanager
async def running(env: WorkflowEnvironment, world: MockWorld) -> AsyncIterator[str]:
    shared = f"shared-{uuid.uuid4()}"
    acts = world.activities()
    async with (
        Worker(env.client, task_queue=shared, workflows=[PayoutWorkflow], activities=acts),
        Worker(env.client, task_queue=world.holder_queue, activities=acts),
    ):
        yield shared


def new_world(**kw: object) -> MockWorld:
    return MockWorld(holder_queue=f"holder-{uuid.uuid4()}", **kw)  # type: ignore[arg-type]


async def start(
    env: WorkflowEnvironment, queue: str, **kw: float
) -> WorkflowHandle[PayoutWorkflow, m.PayoutStatus]:
    inp = m.PayoutInput(payout_id="po-1", account_id="acct-1", **{**FAST, **kw})  # type: ignore[arg-type]
    return await env.client.start_workflow(
        PayoutWorkflow.run, inp, id=f"payout-test-{uuid.uuid4()}", task_queue=queue
    )


async def wait_status(
    handle: WorkflowHandle[PayoutWorkflow, m.PayoutStatus],
    pred: Callable[[m.PayoutStatus], bool],
    timeout_s: float = 60.0,
) -> m.PayoutStatus:
    """Poll the status query of the workflow's latest run until `pred` holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = await handle.query(PayoutWorkflow.status)
        if pred(status):
            return status
        assert asyncio.get_running_loop().time() < deadline, f"never reached: {status}"
        await asyncio.sleep(0.05)
