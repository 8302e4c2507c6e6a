"""Starting a payout's workflow, and driving again a payout that nothing drives any more.

A payout's workflow can end without the payout being terminal only by a person's hand: a
`temporal workflow terminate`, or a Reset in the Temporal UI whose new run was then terminated
(a cancellation request is refused by the workflow itself, docs/workflow.md). Such a payout sits
in the payment database, PENDING or anywhere in flight, with nothing driving it.
`redrive_stranded_payouts` (run by ReconcileWorkflow, i.e. the `reconcile-hourly` Schedule) and
`payouts payout start-pending` find those payouts and start a new workflow for each.

What keeps money safe: the new workflow decides by state and evidence like any other (FR-14 re-read
under a fresh grant with a higher token; a payout in flight goes on by the rail proxy's attempt
record; RAIL_AMBIGUOUS is only looked up and never submitted again, FR-23), so a re-drive can
never submit a second time. The workflow id `payout-{id}` with ALLOW_DUPLICATE_FAILED_ONLY allows
a new run only when the last one ended without completing (terminated, cancelled, timed out,
failed), and never beside a running one.

Owns: `start_payout` (the one way a payout workflow is started, also by `payouts.workload`),
`find_stranded` and the activity. Must never: write to the payment database, or start a workflow
for a terminal payout or one whose workflow is running.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities import models as m
from activities.reconcile_models import REDRIVE_STRANDED, RedriveReport
from common import tracing
from common.logs import get_logger
from common.tracefile import NOT_STARTED

log = get_logger("activities.redrive")

#: The payout workflow's registered type name (workflows.payout.PayoutWorkflow).
PAYOUT_WORKFLOW = "PayoutWorkflow"
_TERMINAL = ("POSTED", "FAILED", "ABANDONED")
#: How a workflow ended that leaves its payout with nothing driving it.
_ENDED_UNFINISHED = frozenset(
    {
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TIMED_OUT,
        WorkflowExecutionStatus.FAILED,
    }
)


def workflow_task_timeout(holder_heartbeat_timeout_s: float) -> timedelta:
    """The payout workflow's task timeout: half the holder heartbeat timeout, within 1..10 s.

    Why (issue 16, takeover): after a frozen holder's step times out, its next workflow task is
    taken by the frozen worker's open long-polls twice, on its sticky queue and then on the
    shared queue, and each time waits out this timeout before another worker may take it. So a
    takeover costs the heartbeat timeout plus twice this: half of it keeps that at about two
    heartbeat timeouts (at a 3 s holder heartbeat timeout, 1.5 s instead of 3 s). It bounds a
    task's processing only, never its wait in the queue, and a healthy worker processes one in
    milliseconds (94 ms per task in a CPU-bound burst): at the default 10 s heartbeat timeout it
    is 5 s (Temporal's own default is 10 s); the 1 s floor keeps a tiny heartbeat timeout from
    timing out healthy tasks.
    """
    return timedelta(seconds=max(1.0, min(10.0, holder_heartbeat_timeout_s / 2)))


def static_summary(inp: m.PayoutInput) -> str:
    """The one line the Temporal UI's workflow list shows: which payout, whose, how much."""
    money = f"amount {inp.amount}" if inp.amount else "amount ?"
    return f"payout {inp.payout_id} · account {inp.account_id} · {money}"


def static_details(inp: m.PayoutInput) -> str:
    """The workflow page's static details (Markdown); the current state is in its current
    details, which the workflow keeps up to date (workflows.details)."""
    amount = f"{inp.amount} (minor units)" if inp.amount else "not given at start"
    return (
        f"**Payout** `{inp.payout_id}`  \n**Account** `{inp.account_id}`  \n"
        f"**Amount** {amount}  \n`payouts payout status {inp.payout_id}` shows what the "
        "workflow knows; the payment database is the record."
    )


async def start_payout(
    client: Client,
    queue: str,
    inp: m.PayoutInput,
    search_attributes: Sequence[SearchAttributePair[Any]] = (),
) -> bool:
    """Start `inp`'s workflow `payout-{id}`; False if one is running or completed already.

    One running workflow per payout, ever: a start beside a running one is refused, and a
    completed one (its payout terminal) is never started again; only a run that ended without
    completing may be followed by a new one (module docstring: why that cannot pay twice).

    Each start is the root of the payout's own trace (common.tracing.payout_root): with a
    traced client, everything the workflow does joins it.
    """
    with tracing.payout_root(inp.payout_id, inp.account_id) as root:
        try:
            await client.start_workflow(
                PAYOUT_WORKFLOW,
                inp,
                id=f"payout-{inp.payout_id}",
                task_queue=queue,
                task_timeout=workflow_task_timeout(inp.holder_heartbeat_timeout_s),
                search_attributes=TypedSearchAttributes(list(search_attributes)),
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
                static_summary=static_summary(inp),
                static_details=static_details(inp),
            )
        except WorkflowAlreadyStartedError:
            root.set_attribute(NOT_STARTED, True)  # the running one has a trace of its own
            return False
    return True


@dataclass
class Stranded:
    payout_id: str
    account_id: str
    state: str
    workflow: str  # how its last workflow ended: TERMINATED, CANCELED, ..., or NONE (never)
    amount: int = 0


async def find_stranded(
    pool: asyncpg.Pool,
    client: Client,
    limit: int = 1000,
    payout_ids: Sequence[str] | None = None,
) -> list[Stranded]:
    """Non-terminal payouts (all, or those of `payout_ids`) whose workflow is not running:
    ended without completing, or never started. A COMPLETED workflow with a non-terminal payout
    cannot be re-driven (its id is spent) and would be a bug: it is reported as an alert event,
    not returned."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT payout_id, account_id, state, amount FROM paydb.payouts"
            " WHERE state <> ALL($1::text[])"
            " AND ($3::text[] IS NULL OR payout_id = ANY($3::text[]))"
            " ORDER BY created_at LIMIT $2",
            list(_TERMINAL),
            limit,
            None if payout_ids is None else list(payout_ids),
        )
    stranded = []
    for r in rows:
        status = await _workflow_status(client, r["payout_id"])
        if status == WorkflowExecutionStatus.COMPLETED:
            log.error(
                "alert",
                name="payout_workflow_completed_non_terminal",
                payout_id=r["payout_id"],
                state=r["state"],
            )
            continue
        if status is None or status in _ENDED_UNFINISHED:
            name = "NONE" if status is None else status.name
            stranded.append(
                Stranded(r["payout_id"], r["account_id"], r["state"], name, int(r["amount"]))
            )
    return stranded


async def _workflow_status(client: Client, payout_id: str) -> WorkflowExecutionStatus | None:
    """The status of the latest run of `payout-{id}`; None if it never existed."""
    try:
        desc = await client.get_workflow_handle(f"payout-{payout_id}").describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return desc.status


class RedriveActivities:
    """`redrive_stranded_payouts`, run by ReconcileWorkflow on the shared queue."""

    def __init__(self, pool: asyncpg.Pool, client: Client, queue: str) -> None:
        self._pool = pool  # the reconciler's read-only pool: this activity never writes paydb
        self._client = client
        self._queue = queue

    @activity.defn(name=REDRIVE_STRANDED)
    async def redrive_stranded_payouts(self, limit: int) -> RedriveReport:
        """Start a new workflow for every stranded payout (idempotent: a second run finds them
        running). Retried without limit: an outage only delays the re-drive."""
        redriven = []
        for s in await find_stranded(self._pool, self._client, limit):
            inp = m.PayoutInput(
                payout_id=s.payout_id,
                account_id=s.account_id,
                correlation_id=s.payout_id,
                amount=s.amount,
            )
            if await start_payout(self._client, self._queue, inp):
                log.warning(
                    "payout.redriven",
                    payout_id=s.payout_id,
                    account_id=s.account_id,
                    state=s.state,
                    previous_workflow=s.workflow,
                )
                redriven.append(f"{s.payout_id}:{s.state}:{s.workflow}")
        return RedriveReport(redriven=redriven, scanned_limit=limit)
