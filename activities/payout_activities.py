"""The activities of PayoutWorkflow: each one step of UC-01, run by the process that holds the
account's lock session.

Every step that writes checks the grant first (`still_held()`, a liveness aid) and then presents
the grant's token to the resource, which is what actually stops a stale holder (FR-15, FR-17).
A fenced rejection becomes a non-retryable `FencedOut` ApplicationError: the workflow abandons
this grant at once and never retries under the same token.

One flat class, one `@activity.defn` method per activity, each delegating to a step object of
`activities/payout/` that receives in its constructor exactly what it uses: `HeldGrants` (this
process's grants), `HolderWriter` (every fenced write), `LockSteps`, `CriticalSteps`,
`ExecuteStep`, `RevokeSteps`, `LookupSteps`. The workflows call these methods by reference
(`workflow.execute_activity_method(PayoutActivities.acquire_lock, ...)`); the activity names
(`activities.models`) are the ones recorded in every history, never to be renamed.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.critical import CriticalSteps
from activities.payout.execute import ExecuteStep
from activities.payout.fenced import HolderWriter
from activities.payout.grants import HeldGrants
from activities.payout.lock_steps import LockSteps
from activities.payout.lookups import LookupSteps
from activities.payout.revokes import RevokeSteps
from common import correlation
from common.credentials import auth_headers
from ledger import PayoutStore
from lockservice.sdk import LockClient
from railproxy.client import RailProxyClient

__all__ = ["PayoutActivities"]


class PayoutActivities:
    """Bound methods registered on the worker; one instance per worker process."""

    def __init__(
        self,
        *,
        locks: LockClient,
        store: PayoutStore,
        proxy: RailProxyClient,
        worker_queue: str,
        worker_id: str,
        lock_url: str,
        token: str | None = None,
        verify: ssl.SSLContext | bool = True,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        pause_before_submit: bool = False,
        crash_at: str = "",
        temporal: Client | None = None,
    ) -> None:
        """`temporal`: the client that hands acquired grants over (`LockSteps.deliver`); None:
        the SDK completes the acquire, and an undelivered grant waits for the idle sweeper.
        `pause_before_submit` (UC-03) and `crash_at` (UC-04): experiments only."""
        self._worker_queue = worker_queue
        # Break-glass revokes go to the lock server's HTTP API with the worker's bearer credential
        # (common.credentials): one client for this instance's lifetime (`aclose`), not one a call.
        self._lock_http = httpx.AsyncClient(
            base_url=lock_url, timeout=10.0, headers=auth_headers(token), verify=verify
        )
        self.grants = HeldGrants(locks)
        writer = HolderWriter(store, self.grants, worker_id=worker_id, crash_at=crash_at)
        self._locking = LockSteps(
            locks=locks, grants=self.grants, worker_queue=worker_queue, temporal=temporal
        )
        self._critical = CriticalSteps(
            store=store,
            writer=writer,
            grants=self.grants,
            proxy=proxy,
            worker_id=worker_id,
            now=now,
            pause_before_submit=pause_before_submit,
        )
        self._execute = ExecuteStep(
            store=store, writer=writer, grants=self.grants, critical=self._critical
        )
        self._revokes = RevokeSteps(store=store, lock_http=self._lock_http)
        self._lookups = LookupSteps(store=store, proxy=proxy, worker_id=worker_id)

    async def __aenter__(self) -> PayoutActivities:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the lock-server client; once the workers running these activities have stopped."""
        await self._lock_http.aclose()

    @property
    def handovers(self) -> int:
        """Grants being handed over to their workflows right now (tests, diagnostics)."""
        return self._locking.handovers

    async def sweep_idle_leases(self, idle_s: float, every_s: float = 5.0) -> None:
        """Release grants no step has used for `idle_s`; until cancelled (the worker starts it)."""
        await self.grants.sweep_idle(idle_s, every_s)

    # ------------------------------------------------------------------ shared queue

    @activity.defn(name=m.ACQUIRE_AND_EXECUTE)
    async def acquire_and_execute(self, req: m.RunRequest) -> m.RunResult:
        """The two-task happy path (issue 29): the worker that is
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
        still holds (`LockSteps.deliver`), as for a lost acquire.
        """
        with correlation.bound(req.acquire.context.correlation_id):
            taken = await self._locking.take_lease(req.acquire)
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
            return self._locking.deliver(taken, result, req.acquire.payout_id)

    @activity.defn(name=m.ACQUIRE_LOCK)
    async def acquire_lock(self, req: m.AcquireRequest) -> m.AcquireResult:
        return await self._locking.acquire_lock(req)

    @activity.defn(name=m.LOOKUP_RAIL)
    async def lookup_rail(self, req: m.LookupRequest) -> m.LookupResult:
        return await self._lookups.lookup_rail(req)

    @activity.defn(name=m.ESCALATE_AMBIGUOUS)
    async def escalate_ambiguous(self, req: m.StepRequest) -> None:
        await self._lookups.escalate_ambiguous(req)

    @activity.defn(name=m.RECORD_SIGNAL_REJECTED)
    async def record_signal_rejected(self, rej: m.SignalRejection) -> None:
        await self._lookups.record_signal_rejected(rej)

    @activity.defn(name=m.ACCEPT_OPERATOR_COMMAND)
    async def accept_operator_command(self, req: m.CommandRequest) -> m.CommandVerdict:
        return await self._lookups.accept_operator_command(req)

    @activity.defn(name=m.SETTLE_OPERATOR_COMMAND)
    async def settle_operator_command(self, req: m.CommandSettlement) -> m.CommandVerdict:
        return await self._lookups.settle_operator_command(req)

    @activity.defn(name=m.CARRY_OUT_REVOKE)
    async def carry_out_revoke(self, req: m.RevokeRequest) -> m.CommandVerdict:
        return await self._revokes.carry_out_revoke(req)

    # ------------------------------------------------------------------ holder queue
    # Each critical-section step runs inside `HeldGrants.holding`: its grant is marked in use
    # (the idle sweeper leaves it alone) and it heartbeats for its whole duration.

    @activity.defn(name=m.EXECUTE_PAYOUT)
    async def execute_payout(self, req: m.StepRequest) -> m.PayoutView:
        async with self.grants.holding(req):
            return await self._execute.execute_payout(req)

    @activity.defn(name=m.SUBMIT_TO_RAIL)
    async def submit_to_rail(self, req: m.StepRequest) -> m.PayoutView:
        async with self.grants.holding(req):
            return await self._critical.submit_to_rail(req)

    @activity.defn(name=m.RECOVER_FROM_ATTEMPT)
    async def recover_from_attempt(self, req: m.StepRequest) -> m.PayoutView:
        async with self.grants.holding(req):
            return await self._critical.recover_from_attempt(req)

    @activity.defn(name=m.POST_TO_LEDGER)
    async def post_to_ledger(self, req: m.StepRequest) -> m.PayoutView:
        async with self.grants.holding(req):
            return await self._critical.post_to_ledger(req)

    @activity.defn(name=m.RESOLVE_AMBIGUOUS)
    async def resolve_ambiguous(self, req: m.StepRequest) -> m.PayoutView:
        async with self.grants.holding(req):
            return await self._critical.resolve_ambiguous(req)

    @activity.defn(name=m.ABANDON_PAYOUT)
    async def abandon_payout(self, req: m.StepRequest) -> m.PayoutView:
        async with self.grants.holding(req):
            return await self._critical.abandon_payout(req)

    @activity.defn(name=m.RELEASE_LOCK)
    async def release_lock(self, req: m.StepRequest) -> None:
        await self._locking.release_lock(req)

    # ------------------------------------------------------------------ registration

    def shared_queue_activities(self) -> list[Callable[..., Any]]:
        """Activities any worker may run: they need no grant held by this process (the
        two-task path takes its own grant and keeps it in this process)."""
        return [
            self.acquire_and_execute,
            self.acquire_lock,
            self.lookup_rail,
            self.escalate_ambiguous,
            self.record_signal_rejected,
            self.accept_operator_command,
            self.settle_operator_command,
            self.carry_out_revoke,
        ]

    def holder_queue_activities(self) -> list[Callable[..., Any]]:
        """The critical section: run only on this process's own queue, under its session."""
        return [
            self.execute_payout,
            self.submit_to_rail,
            self.recover_from_attempt,
            self.post_to_ledger,
            self.resolve_ambiguous,
            self.abandon_payout,
            self.release_lock,
        ]
