"""The activities of PayoutWorkflow: each one step of UC-01, run by the process that holds the
account's lock session.

Every step that writes checks the grant first (`still_held()`, a liveness aid) and then presents
the grant's token to the resource, which is what actually stops a stale holder (FR-15, FR-17).
A fenced rejection becomes a non-retryable `FencedOut` ApplicationError: the workflow abandons
this grant at once and never retries under the same token.

The steps live in `activities/payout/`, one module per concern; PayoutActivities composes
them and says which queue runs which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.base import _holder_step
from activities.payout.execute import ExecuteStep
from activities.payout.lock_steps import LockSteps
from activities.payout.lookups import LookupSteps
from common import correlation
from common.lockkey import lock_key

# Importable from here as before (worker_main, tests): the one lock-key definition and the
# holder-step decorator.
__all__ = ["PayoutActivities", "_holder_step", "lock_key"]


class PayoutActivities(LockSteps, ExecuteStep, LookupSteps):
    """Bound methods registered on the worker; one instance per worker process."""

    async def __aenter__(self) -> PayoutActivities:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the lock-server client; once the workers running these activities have stopped."""
        await self._lock_http.aclose()

    @activity.defn(name=m.ACQUIRE_AND_EXECUTE)
    async def acquire_and_execute(self, req: m.RunRequest) -> m.RunResult:
        """The two-task happy path (patch `acquire-and-execute`, issue 29): the worker that is
        granted the account's lock runs the critical section in the same activity, in the same
        process that holds the session, one workflow task and one activity fewer per payout.

        Why it cannot submit twice: the workflow schedules it with maximum_attempts=1, so no
        retry can reach the submit again; inside, it is execute_payout, which submits only a
        payout THIS attempt claimed from PENDING under THIS grant (a payout found anywhere else
        goes back to the workflow with the proxy's attempt record, for state-based recovery);
        the fences refuse a stale token at both enforcement points and the proxy refuses a
        second attempt for the payout (FR-17, FR-18). Whatever fails after the grant is
        obtained is answered, not raised (`failure`), so the workflow learns the token and
        handles it as a failed execute_payout: the next grant recovers by evidence. If the
        answer never reaches the workflow (the attempt timed out, the workflow is gone), the
        worker completes it itself and hears Temporal refuse it, and gives back a grant it
        still holds (`_hand_over`), as for a lost acquire.
        """
        with correlation.bound(req.acquire.context.correlation_id):
            taken = await self._take_lease(req.acquire)
            if isinstance(taken, m.AcquireResult):
                return m.RunResult(grant=taken)
            grant = m.AcquireResult(
                acquired=True, token=taken.token, worker_queue=self._worker_queue
            )
            deadline = datetime.now(UTC) + timedelta(seconds=req.submit_deadline_s)
            step = m.StepRequest(
                payout_id=req.acquire.payout_id,
                account_id=req.acquire.account_id,
                token=taken.token,
                context=dataclasses.replace(req.acquire.context, deadline_at=deadline.isoformat()),
            )
            try:
                result = m.RunResult(grant=grant, view=await self.execute_payout(step))
            except ApplicationError as exc:
                failure = m.StepFailure(type=exc.type or "", message=str(exc)[:1000])
                result = m.RunResult(grant=grant, failure=failure)
            except Exception as exc:  # a database or proxy error: as a failed execute_payout
                failure = m.StepFailure(type="", message=f"{type(exc).__name__}: {exc}"[:1000])
                result = m.RunResult(grant=grant, failure=failure)
            return self._deliver(taken, result, req.acquire.payout_id)

    def shared_queue_activities(self) -> list[Callable[..., Any]]:
        """Activities any worker may run: they need no grant held by this process (the
        two-task path takes its own grant and keeps it in this process)."""
        return [
            self.acquire_and_execute,
            self.acquire_lock,
            self.lookup_rail,
            self.escalate_ambiguous,
            self.revoke_lock,
            self.record_signal_rejected,
            self.accept_operator_command,
            self.settle_operator_command,
            self.carry_out_revoke,
        ]

    def holder_queue_activities(self) -> list[Callable[..., Any]]:
        """The critical section: run only on this process's own queue, under its session."""
        return [
            self.execute_payout,
            self.reread_and_claim,
            self.submit_to_rail,
            self.recover_from_attempt,
            self.post_to_ledger,
            self.resolve_ambiguous,
            self.abandon_payout,
            self.release_lock,
        ]
