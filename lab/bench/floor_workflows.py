"""No-op workflows of the payout's shapes, for the engine-floor benchmark (lab.bench.floor).

Registered only by the benchmarks' own in-process workers (lab.bench.floor), never by the
production worker (worker_main.py); they live in the lab, beside the one benchmark that runs them.

Owns: three shapes. `FloorToday`: PayoutWorkflow's commands before the merge (one activity on
the shared queue returning a worker queue, then claim, submit, post and release on that queue: 5
activities, 6 workflow tasks; `baseline_floor`). `FloorMerged`: claim+submit+post as one holder
activity and release after it (3 activities, 4 workflow tasks; the issue's trial).
`FloorExecute`: PayoutWorkflow's commands in its three-task shape (`two_task=False`: the
acquire, then one holder activity that also releases: 2 activities, 3 workflow tasks).
`FloorRun`: its two-task shape, one activity on the shared queue that acquires and executes
(1 activity, 2 workflow tasks; `floor` when the payouts take 2 tasks, issue 29). Must never:
touch money, a lock or a database; it measures what Temporal alone costs for a workflow of that
shape.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

_T = timedelta(seconds=60)


@workflow.defn(name="FloorToday")
class FloorToday:
    @workflow.run
    async def run(self, shared_queue: str) -> int:
        queue: str = await workflow.execute_activity(
            "floor_acquire", task_queue=shared_queue, start_to_close_timeout=_T
        )
        for step in ("floor_claim", "floor_submit", "floor_post", "floor_release"):
            await workflow.execute_activity(step, task_queue=queue, start_to_close_timeout=_T)
        return 6


@workflow.defn(name="FloorMerged")
class FloorMerged:
    @workflow.run
    async def run(self, shared_queue: str) -> int:
        queue: str = await workflow.execute_activity(
            "floor_acquire", task_queue=shared_queue, start_to_close_timeout=_T
        )
        for step in ("floor_execute", "floor_release"):
            await workflow.execute_activity(step, task_queue=queue, start_to_close_timeout=_T)
        return 4


@workflow.defn(name="FloorExecute")
class FloorExecute:
    @workflow.run
    async def run(self, shared_queue: str) -> int:
        queue: str = await workflow.execute_activity(
            "floor_acquire", task_queue=shared_queue, start_to_close_timeout=_T
        )
        await workflow.execute_activity(
            "floor_execute_release", task_queue=queue, start_to_close_timeout=_T
        )
        return 3


@workflow.defn(name="FloorRun")
class FloorRun:
    @workflow.run
    async def run(self, shared_queue: str) -> int:
        await workflow.execute_activity(
            "floor_acquire_execute", task_queue=shared_queue, start_to_close_timeout=_T
        )
        return 2
