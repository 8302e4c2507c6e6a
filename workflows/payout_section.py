"""The grant and what PayoutWorkflow does under it (`CriticalSection`): the acquire (or the
two-task `acquire_and_execute`), the merged holder step, the state-based steps after it, the
ambiguous payout's resolution or abandon, and the release.

Owns: the commands issued under one grant, in order, with their retry policies and timeouts.
Must never: retry the submit (one attempt: `SUBMIT_ONCE`), decide recovery by elapsed time
instead of the payout's state and the proxy's attempt record, or let an `ActivityError` out of
`run` (a failed step ends the section; the workflow backs off and re-acquires). Deterministic
workflow code, imported by `workflows.payout` inside the sandbox.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from ledger.states import PayoutState
    from workflows.operator_desk import cause
    from workflows.payout_state import PayoutRun
    from workflows.payout_steps import (
        DB_WRITE_RETRY,
        EXECUTE_SUMMARY,
        RUN_SUMMARY,
        SUBMIT_ONCE,
        HolderStep,
        Next,
        is_type,
        next_step,
    )

__all__ = ["CriticalSection"]


class CriticalSection:
    """The grants of one run of one payout, and the steps under each."""

    def __init__(self, run: PayoutRun) -> None:
        self._run = run
        self._input = run.input
        self.contended = False  # the last acquire found the key held by another grant
        # Releases after a holder timeout, running beside the next acquire; awaited before the
        # run ends or continues as new, so that none is abandoned mid-flight.
        self._background_releases: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ the grant

    async def acquire(self) -> m.AcquireResult | None:
        """The three-task shape's acquire on the shared queue. None: no grant."""
        inp = self._input
        # A frozen (SIGSTOPped) worker's open long-poll still receives this task; without a
        # heartbeat timeout the task then waits out acquire_wait_s + 5 s before another worker
        # may try. The activity heartbeats while it waits on the lock server. Money cannot move
        # twice through this: a grant obtained by an attempt Temporal already timed out goes to
        # nobody (the worker, which completes the activity itself, hears Temporal refuse the
        # answer and releases it at once), and a later grant has a higher token.
        try:
            result: m.AcquireResult = await workflow.execute_activity_method(
                PayoutActivities.acquire_lock,
                m.AcquireRequest(
                    payout_id=inp.payout_id,
                    account_id=inp.account_id,
                    wait_s=inp.acquire_wait_s,
                    context=self._run.context("acquire"),
                ),
                start_to_close_timeout=timedelta(seconds=inp.acquire_wait_s + 5),
                heartbeat_timeout=timedelta(seconds=inp.holder_heartbeat_timeout_s),
                # The SDK already retries transport errors a bounded number of times with
                # jitter; the workflow's own backoff handles the rest. One attempt here.
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            self.contended = False
            self._run.last_error = f"acquire failed: {cause(err)}"
            return None
        self.contended = result.reason in ("held", "timeout")
        if not result.acquired:
            self._run.last_error = f"lock not acquired: {result.reason}"
            return None
        self._run.token = result.token
        return result

    async def acquire_and_execute(self) -> m.RunResult | None:
        """The two-task path's one activity: the acquire, and under its grant the merged holder
        step, in the worker that got the grant.

        What prevents a double payout: ONE attempt (`SUBMIT_ONCE`), because the activity may
        reach the submit; inside it is execute_payout, which submits only a payout it claimed
        from PENDING itself (the activity's docstring has the rest). None: the activity itself
        failed (a worker died or froze in it: its grant, if any, has an older token than the
        next one, and the fences refuse it), so the next acquire comes soon."""
        inp = self._input
        try:
            run: m.RunResult = await workflow.execute_activity_method(
                PayoutActivities.acquire_and_execute,
                m.RunRequest(
                    acquire=m.AcquireRequest(
                        payout_id=inp.payout_id,
                        account_id=inp.account_id,
                        wait_s=inp.acquire_wait_s,
                        context=self._run.context("execute"),
                    ),
                    submit_deadline_s=inp.submit_deadline_s,
                ),
                # The acquire's wait, then the merged step's own bound (see `_on_holder`).
                start_to_close_timeout=timedelta(seconds=inp.acquire_wait_s + 5 + 60),
                heartbeat_timeout=timedelta(seconds=inp.holder_heartbeat_timeout_s),
                retry_policy=SUBMIT_ONCE,
                summary=RUN_SUMMARY,
            )
        except ActivityError as err:
            self.contended = isinstance(err.cause, ActivityTimeout)
            self._run.last_error = f"acquire and execute failed: {cause(err)}"
            return None
        grant = run.grant
        self.contended = grant.reason in ("held", "timeout")
        if not grant.acquired:
            self._run.last_error = f"lock not acquired: {grant.reason}"
        else:
            self._run.token = grant.token
        return run

    # ------------------------------------------------------------------ under the grant

    async def run(self, grant: m.AcquireResult, done: m.RunResult | None = None) -> bool:
        """Run the steps the payout's state calls for, under one grant. Returns whether the
        payout progressed (False: retry later after a backoff). `done`: what acquire_and_execute
        already did under this grant (the two-task path), in place of execute_payout."""
        holder_timed_out = False
        released = False  # by execute_payout, at the end of its last step
        try:
            if done is not None and done.failure is not None:
                return self._failed(grant, done.failure.type, done.failure.message)
            if done is not None and done.view is not None:
                view = done.view
                self._run.observe(view)
            else:
                view = await self._execute(grant)
            released = view.released
            if "submit" in view.steps and view.state == PayoutState.CLAIMED.value:
                # NOT_SUBMITTED (circuit open, admission full, ...): try again later, under a
                # new grant, by the state-based path (which reads the attempt record first).
                self._run.last_error = f"not submitted: {view.detail}"
                return False
            return await self._advance(grant, view)
        except ActivityError as err:
            # A timeout means the holder's worker died or stalled: re-acquire at once, and
            # recovery reads the state afresh. Anything else: back off before the next try.
            holder_timed_out = isinstance(err.cause, ActivityTimeout)
            kind = err.cause.type or "" if isinstance(err.cause, ApplicationError) else ""
            return self._failed(grant, kind, cause(err)) or holder_timed_out
        finally:
            if not released:
                await self._release_after(grant, holder_timed_out)

    def _failed(self, grant: m.AcquireResult, kind: str, why: str) -> bool:
        """A failed critical-section step: True when the grant is lost (fenced out, lock lost):
        never retried under the same token, re-acquired at once."""
        self._run.last_error = why
        if kind in (m.FENCED_OUT, m.LOCK_LOST):
            workflow.logger.warning("grant %s lost: %s", grant.token, why)
            return True
        return False

    async def _on_holder(
        self,
        activity: HolderStep,
        req: m.StepRequest,
        queue: str,
        retry: RetryPolicy,
        summary: str | None = None,
    ) -> m.PayoutView:
        # The critical-section activities run on the lock holder's own task queue. If that
        # worker dies, nothing polls the queue and schedule-to-start (or the heartbeat timeout,
        # mid-activity) fires; the workflow then re-acquires with a new, higher token. Every one
        # of these steps heartbeats for its whole duration (`HeldGrants.holding` in the activities),
        # also while it legitimately waits, e.g. post_to_ledger on the contended rail_clearing
        # balance row's lock: so the heartbeat timeout fires only when the worker is gone, and
        # start-to-close still bounds a step whose worker lives but hangs.
        view = await workflow.execute_activity_method(
            activity,
            req,
            task_queue=queue,
            retry_policy=retry,
            schedule_to_start_timeout=timedelta(seconds=self._input.holder_pickup_s),
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=self._input.holder_heartbeat_timeout_s),
            summary=summary,
        )
        self._run.observe(view)
        return view

    async def _execute(self, grant: m.AcquireResult) -> m.PayoutView:
        """UC-01 steps 3-9 as one holder activity (the acquire was a separate activity).

        What prevents a double payout: ONE attempt (`SUBMIT_ONCE`), because the activity may
        reach the submit; it submits only a payout it claimed from PENDING itself; and any
        failure or timeout (FENCED_OUT, LOCK_LOST, a dead or frozen holder, a database error
        after the submit) ends this critical section without a retry: the next grant re-reads
        the state and recovers by the proxy's attempt record (`_advance`: recover_from_attempt,
        or a submit only when the record proves nothing was handed off), as for a failed
        `submit_to_rail`. The proxy also refuses a second attempt for the payout (FR-18).
        FR-14 holds: the activity re-reads the payout under the grant before anything else.
        """
        return await self._on_holder(
            PayoutActivities.execute_payout,
            self._run.step(grant, "execute"),
            grant.worker_queue,
            SUBMIT_ONCE,
            summary=EXECUTE_SUMMARY,
        )

    async def _advance(self, grant: m.AcquireResult, view: m.PayoutView) -> bool:
        """The state-based steps (`next_step`) until the payout is terminal, ambiguous with
        nothing to do under a grant, or must wait. Returns whether it progressed."""
        queue = grant.worker_queue
        while True:
            step = next_step(view)
            if step is Next.DONE:
                return True
            if step is Next.SUBMIT:
                # The proxy's record proves nothing was handed off (FR-24); the proxy itself
                # refuses a second attempt for this payout (FR-18), and the submit is one
                # attempt (`SUBMIT_ONCE`), so even a wrong decision here cannot pay twice.
                req = self._run.step(grant, "submit")
                view = await self._on_holder(
                    PayoutActivities.submit_to_rail, req, queue, SUBMIT_ONCE
                )
                if view.state == PayoutState.CLAIMED.value:
                    # NOT_SUBMITTED (circuit open, admission full, ...): try again later.
                    self._run.last_error = f"not submitted: {view.detail}"
                    return False
            elif step is Next.RECOVER:
                # Recovery by evidence: the attempt's recorded outcome decides; an attempt with
                # no outcome becomes RAIL_AMBIGUOUS and is never resubmitted (UC-04, FR-23).
                req = self._run.step(grant, "recover")
                view = await self._on_holder(
                    PayoutActivities.recover_from_attempt, req, queue, DB_WRITE_RETRY
                )
            elif step is Next.POST:
                req = self._run.step(grant, "post")
                view = await self._on_holder(
                    PayoutActivities.post_to_ledger, req, queue, DB_WRITE_RETRY
                )
            elif step is Next.AMBIGUOUS:
                resolved = await self._ambiguous(grant)
                if resolved is None:
                    return True  # release the lock; resolve by lookups outside the section
                view = resolved
            elif step is Next.LATER:
                # The claim did not happen (e.g. another holder's work in flight): retry later.
                return False
            else:
                # A state this code does not know (a newer deployment's?): never a reason to
                # fail the workflow. Report it, back off and read the state afresh under a new
                # grant.
                self._run.last_error = f"unexpected payout state {view.state}"
                workflow.logger.error("unexpected payout state %s", view.state)
                return False

    # ------------------------------------------------------------------ ambiguity (UC-05)

    async def _ambiguous(self, grant: m.AcquireResult) -> m.PayoutView | None:
        """RAIL_AMBIGUOUS under a grant. Evidence outranks any command: a rail outcome already
        known is applied, and a pending abandon is refused naming it; otherwise a pending
        abandon is carried out, unless the abandon activity's own last lookup finds the rail's
        evidence first. None: nothing to do under this grant."""
        run, desk = self._run, self._run.desk
        pending = desk.pending_abandon()
        if not run.resolution and pending is not None:
            view = await self._abandon(grant, pending)
            if not view.evidence:
                if view.state == PayoutState.ABANDONED.value:
                    desk.carried_out(pending, "ABANDONED")
                return view
            run.learn(view.evidence, "the abandon's last lookup")
        if not run.resolution:
            return None
        if pending is not None and pending.status == "pending":
            why = f"the rail's evidence came first ({run.evidence}): abandon refused"
            await desk.refuse(pending, why, code="evidence")
        view = await self._on_holder(
            PayoutActivities.resolve_ambiguous,
            run.step(grant, "resolve", resolution=run.resolution),
            grant.worker_queue,
            DB_WRITE_RETRY,
        )
        run.resolution = ""
        return view

    async def _abandon(self, grant: m.AcquireResult, pending: m.CommandRecord) -> m.PayoutView:
        """The accepted abandon, carried out by the payment store under this grant and under
        the acceptance it recorded (so an assertion that expired meanwhile does not matter)."""
        try:
            return await self._on_holder(
                PayoutActivities.abandon_payout,
                self._run.step(
                    grant,
                    "abandon",
                    operator=pending.actor,
                    reason=pending.reason,
                    command_id=pending.command_id,
                ),
                grant.worker_queue,
                DB_WRITE_RETRY,
            )
        except ActivityError as err:
            if not is_type(err, m.ASSERTION_REFUSED):
                raise  # an outage or a lost grant: the abandon stays pending for the next grant
            why = f"abandon refused: {cause(err)}"
            await self._run.desk.refuse(pending, why, code="refused")
            return m.PayoutView(
                payout_id=self._input.payout_id,
                account_id=self._input.account_id,
                state=self._run.state,
            )

    # ------------------------------------------------------------------ the release

    async def _release_after(self, grant: m.AcquireResult, holder_timed_out: bool) -> None:
        if not holder_timed_out:
            await self._release(grant)
            return
        # Not awaited: the run loop re-acquires at once. What prevents a double payout meanwhile
        # is fencing, not this release: the next grant has a higher token, and the paydb and the
        # proxy refuse the timed-out holder's writes under its own; the release itself is the
        # server's compare-and-delete on this grant's (key, session, token), so it can never end
        # the next one.
        self._background_releases.append(asyncio.create_task(self._release(grant, short=True)))

    async def _release(self, grant: m.AcquireResult, *, short: bool = False) -> None:
        # `short`: the holder just timed out (frozen, dead or stalled). Its frozen long-poll may
        # take this task too, so one attempt bounded by the heartbeat timeout, not two of 10 s
        # (21 s of a 45 s takeover, issue 16). A release that does not happen here only delays
        # the next holder, never safety: the holder's idle sweeper gives the grant back, a dead
        # holder's session expires, and a release the lock server did not answer stays pending
        # in the holder's SDK, retried until it succeeds or the session ends (issue 24, item 6).
        inp = self._input
        limit = min(10.0, inp.holder_heartbeat_timeout_s) if short else 10.0
        try:
            await workflow.execute_activity_method(
                PayoutActivities.release_lock,
                self._run.step(grant, "release"),
                task_queue=grant.worker_queue,
                schedule_to_start_timeout=timedelta(seconds=inp.holder_pickup_s),
                start_to_close_timeout=timedelta(seconds=limit),
                retry_policy=RetryPolicy(maximum_attempts=1 if short else 2),
            )
        except ActivityError as err:
            # A lost release only delays the next holder (see above); safety never depends on it
            # (the next grant has a higher token).
            workflow.logger.info("release of token %s failed: %s", grant.token, cause(err))

    async def background_releases_done(self) -> None:
        """Await the releases running beside later acquires (before the run ends or continues)."""
        releases, self._background_releases = self._background_releases, []
        for release in releases:
            await release  # `_release` never raises: a failed release is only logged
