"""PayoutWorkflow: one payout, executed exactly once, following UC-01 step by step.

Each UC-01 step stays identifiable in the Temporal UI. The happy path takes two workflow tasks:
one activity on the shared queue, `acquire_and_execute`, in which the worker granted the
account's lock re-reads and claims, submits, posts and releases (`inp.two_task=False`, the A/B
switch: the acquire, then the merged holder step `execute_payout` on that worker's queue). A
payout found in flight goes on by the named state-based steps (recover, submit, post, release).
Recovery (UC-04, FR-24) is decided by the payout's state and the rail proxy's attempt record,
never by elapsed time (`workflows.payout_steps.next_step`). RAIL_AMBIGUOUS is resolved only by
lookups by client reference or by an operator (UC-05, `workflows.operator_desk`).

Owns: the order of the steps, their retry policies, the operator signals and the workflow's
history size (continue-as-new). Must never: retry the submit, fail for an infrastructure reason
(an outage of the lock service, the database, the rail or every worker only delays a payout,
docs/architecture.md#workflow-shape), or let an operator command that cannot be carried out
escape a signal handler.

Read whole: the class is one object over ~400 lines because its coroutines share the run's
state (state, token, grant, resolution, lookups) and every command it issues is part of the
history a replay checks, so its order must be reviewable in one place; the decisions that need
none of that state live in `workflows.payout_steps`, the operator commands in
`workflows.operator_desk`. Changing a command it issues follows docs/workflow.md, "Changing the
workflow" (`workflow.patched`, a replay history per new branch).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from ledger.states import TERMINAL_STATES, PayoutState
    from workflows.details import Snapshot, current_details
    from workflows.operator_desk import Facts, OperatorDesk, cause
    from workflows.payout_steps import (
        CARRIED_REJECTIONS,
        DB_WRITE_RETRY,
        EXECUTE_SUMMARY,
        RUN_SUMMARY,
        SUBMIT_ONCE,
        HolderStep,
        Next,
        backoff,
        changed_search_attributes,
        is_type,
        next_step,
        unlimited_retry,
    )

__all__ = ["PayoutWorkflow"]


@workflow.defn(name="PayoutWorkflow")
class PayoutWorkflow:
    @workflow.init
    def __init__(self, inp: m.PayoutInput) -> None:
        # State is restored here, not in run(): signals delivered in a run's first activation
        # are handled before run() starts, and must see the carried state (escalation, ...).
        self._input = inp
        self._state = PayoutState.PENDING.value
        self._token = 0
        self._attempt: m.AttemptView | None = None
        self._client_reference = ""
        self._escalated = False
        self._ambiguous_since: datetime | None = None
        self._rejections: list[m.SignalRejection] = []
        self._last_error = ""
        self._steps = 0
        self._lookups = 0  # in this run; bounds the history (continue-as-new)
        self._runs = 1
        self._resolution = ""  # "settled" or "absent", from the rail's lookup evidence
        self._contended = False  # the last acquire found the key held by another grant
        # Releases after a holder timeout, running beside the next acquire; awaited before the
        # run ends or continues as new, so that none is abandoned mid-flight.
        self._background_releases: list[asyncio.Task[None]] = []
        self._evidence = ""  # what the rail said that decided `_resolution`
        self._lookups_before = 0  # lookups of this payout in the runs before this one
        self._last_lookup: m.LookupRecord | None = None
        self._amount = inp.amount  # from the starter; then from the payment database's view
        self._failure_reason: str | None = None
        self._step_name = ""  # the step it is at (the Temporal UI's current details)
        carried = inp.carried.commands if inp.carried is not None else []
        if inp.carried is not None:
            self._restore(inp.carried)
        retry = unlimited_retry(inp)
        self._desk = OperatorDesk(inp, self._facts, retry, carried, self._rejections)
        if inp.carried is not None:
            self._desk.cancel_requests = inp.carried.cancel_requests

    # ------------------------------------------------------------------ entry point

    @workflow.run
    async def run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        # A payout workflow is never cancelled (UI "Request Cancellation", `temporal workflow
        # cancel`): the payout runs in a task of its own, shielded, so that the cancellation
        # reaches only this primary task, which records and audits it and goes on waiting. No
        # activity of the payout is cancelled by it, so no submit is cut off mid-flight.
        payout = asyncio.create_task(self._run(inp))
        while True:
            try:
                return await asyncio.shield(payout)
            except asyncio.CancelledError:
                if payout.done():
                    return payout.result()  # ended meanwhile (or evicted: re-raises that)
                if workflow.cancellation_reason() is None or payout.cancelling():
                    # Not a cancellation request: the worker is evicting this workflow from
                    # its cache, which cancels every task of it; let the SDK finish that.
                    raise
                self._desk.cancel_requested()

    async def _run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        revoker = asyncio.create_task(self._desk.run_revokes())
        self._publish()
        backoff_round = 0
        while self._state not in TERMINAL_STATES:
            if self._continue_as_new_due():
                # A safe point: no critical section is open and no grant is held.
                await self._continue_as_new(revoker)
            if self._state == PayoutState.RAIL_AMBIGUOUS.value and not self._resolution_known():
                await self._resolve_ambiguity(inp)
                continue
            # `inp.two_task`: the A/B switch of the starter (issue 29), not a patch.
            run = await self._acquire_and_execute(inp) if inp.two_task else None
            if inp.two_task:
                grant = run.grant if run is not None and run.grant.acquired else None
            else:
                grant = await self._acquire(inp)
            if grant is None:
                # Fail closed (UC-08, FR-27): no grant, no execution. The payout stays as it is
                # and we try again after a jittered backoff: no thundering herd. Contention (the
                # account's other payout holds the lock) is normal: the acquire already waited
                # its budget, so retry soon; an unavailable lock service backs off exponentially.
                if self._contended:
                    await workflow.sleep(
                        backoff(inp, 0), summary="the account's lock is held: try again"
                    )
                else:
                    backoff_round += 1
                    await workflow.sleep(
                        backoff(inp, backoff_round),
                        summary=f"backoff {backoff_round}: {self._last_error[:120]}",
                    )
                continue
            progressed = await self._critical_section(inp, grant, run)
            if progressed:
                backoff_round = 0
            else:
                backoff_round += 1
                await workflow.sleep(
                    backoff(inp, backoff_round),
                    summary=f"backoff {backoff_round}: {self._last_error[:120]}",
                )
        await self._drop_pending_commands(revoker)
        await self._background_releases_done()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._desk.settle_audits()
        return self.status()

    # ------------------------------------------------------------------ queries and signals

    @workflow.query
    def status(self) -> m.PayoutStatus:
        return m.PayoutStatus(
            payout_id=self._input.payout_id,
            state=self._state,
            token=self._token,
            attempt=self._attempt,
            escalated=self._escalated,
            rejected_signals=list(self._rejections),
            last_error=self._last_error,
            pending_revokes=self._desk.pending_revokes(),
            runs=self._runs,
            account_id=self._input.account_id,
            resolution=self._resolution,
            evidence=self._evidence,
            lookups=self._lookups_before + self._lookups,
            last_lookup=self._last_lookup,
            commands=self._desk.records(),
            cancel_requests=self._desk.cancel_requests,
        )

    def _facts(self) -> Facts:
        return Facts(
            state=self._state,
            escalated=self._escalated,
            resolution=self._resolution,
            evidence=self._evidence,
        )

    # Signals: one dynamic handler takes every signal, whatever its name, arity or payload
    # (raw values, decoded by the desk itself), so that nothing a sender sends can make the
    # SDK raise on dispatch (two arguments wedged the workflow) or drop a signal unaudited (a
    # payload the converter cannot decode). Nothing in a handler may raise.

    @workflow.signal(
        dynamic=True,
        description="abandon | revoke: an OperatorCommand {operator, reason, assertion}; any "
        "other signal, or a payload that is not one command, is refused and audited",
    )
    async def signal(self, name: str, args: Sequence[RawValue]) -> None:
        await self._desk.on_signal(name, args)

    # Updates: the same commands with the verdict sent back to the caller (`payouts payout
    # abandon|revoke`). The validator refuses what the payout's state does not allow before
    # anything enters the history; an accepted one is verified by the payment store, and a
    # refusal there fails the update (type OperatorCommandRefused), never the workflow.

    @workflow.update(name="abandon", description="RAIL_AMBIGUOUS -> ABANDONED, after the SLA")
    async def abandon_update(self, cmd: m.OperatorCommand) -> m.CommandRecord:
        return await self._desk.on_update("abandon", cmd)

    @abandon_update.validator
    def _validate_abandon(self, cmd: m.OperatorCommand) -> None:
        self._desk.validate("abandon", cmd)

    @workflow.update(name="revoke", description="force-revoke this payout's lock (UC-06)")
    async def revoke_update(self, cmd: m.OperatorCommand) -> m.CommandRecord:
        return await self._desk.on_update("revoke", cmd)

    @revoke_update.validator
    def _validate_revoke(self, cmd: m.OperatorCommand) -> None:
        self._desk.validate("revoke", cmd)

    async def _drop_pending_commands(self, revoker: asyncio.Task[None]) -> None:
        """The payout is terminal: a revoke not carried out by now is refused, not carried out,
        because the account's lock may already belong to its next payout; an abandon still
        pending is ended by the state it met."""
        await self._desk.stop(revoker, cancel_in_flight=True)
        await self._desk.drop_pending_revokes(self._state)
        await self._end_pending_abandon()

    async def _end_pending_abandon(self) -> None:
        """A terminal payout with an abandon still pending: ABANDONED means it was carried out
        (its result was lost with the holder; the store ended the command in the same
        transaction as the transition); any other state came first."""
        pending = self._desk.pending_abandon()
        if pending is None:
            return
        if self._state == PayoutState.ABANDONED.value:
            self._desk.carried_out(pending, "ABANDONED")
        else:
            why = f"payout reached {self._state} before the abandon was carried out"
            await self._desk.refuse(pending, why, code="terminal")

    # ------------------------------------------------------------------ continue-as-new

    def _continue_as_new_due(self) -> bool:
        return (
            self._lookups >= max(1, self._input.max_lookups_per_run)
            or workflow.info().is_continue_as_new_suggested()
        )

    async def _continue_as_new(self, revoker: asyncio.Task[None]) -> None:
        """Hand the payout to a fresh run with an empty history, carrying what only the workflow
        knows. Called only between critical sections, so no grant is held across the gap."""
        # Never cancelled mid-revoke (issue 24, item 7): the one in flight ends first, so it is
        # neither lost nor carried out again by the next run.
        await self._desk.stop(revoker, cancel_in_flight=False)
        await self._background_releases_done()
        await self._desk.settle_audits()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.logger.info("continuing as new after %s lookups", self._lookups)
        workflow.continue_as_new(dataclasses.replace(self._input, carried=self._carry()))

    def _carry(self) -> m.CarriedState:
        return m.CarriedState(
            state=self._state,
            token=self._token,
            attempt=self._attempt,
            client_reference=self._client_reference,
            escalated=self._escalated,
            ambiguous_since=self._ambiguous_since.isoformat() if self._ambiguous_since else None,
            resolution=self._resolution,
            # Every rejection is audited in the payment database; the carried list only feeds the
            # status query, so a flood of bad signals cannot grow the next run's input unbounded.
            rejected_signals=self._rejections[-CARRIED_REJECTIONS:],
            last_error=self._last_error,
            runs=self._runs,
            commands=self._desk.carry(),
            evidence=self._evidence,
            lookups=self._lookups_before + self._lookups,
            last_lookup=self._last_lookup,
            cancel_requests=self._desk.cancel_requests,
        )

    def _restore(self, c: m.CarriedState) -> None:
        self._state = c.state
        self._token = c.token
        self._attempt = c.attempt
        self._client_reference = c.client_reference
        self._escalated = c.escalated
        if c.ambiguous_since:
            self._ambiguous_since = datetime.fromisoformat(c.ambiguous_since)
        self._resolution = c.resolution
        self._rejections = list(c.rejected_signals)
        self._last_error = c.last_error
        self._runs = c.runs + 1
        self._evidence = c.evidence
        self._lookups_before = c.lookups
        self._last_lookup = c.last_lookup

    # ------------------------------------------------------------------ steps

    def _context(
        self, inp: m.PayoutInput, step: str, deadline_s: float | None = None
    ) -> m.WorkContext:
        self._steps += 1
        self._step_name = step
        self._show()
        info = workflow.info()
        deadline = None
        if deadline_s is not None:
            deadline = (workflow.now() + timedelta(seconds=deadline_s)).isoformat()
        return m.WorkContext(
            correlation_id=inp.correlation_id or inp.payout_id,
            causation_id=f"{info.workflow_id}:{info.run_id}:{step}:{self._steps}",
            deadline_at=deadline,
        )

    def _step(
        self, inp: m.PayoutInput, grant: m.AcquireResult, name: str, **kw: Any
    ) -> m.StepRequest:
        deadline_s = inp.submit_deadline_s if name in ("submit", "execute") else None
        return m.StepRequest(
            payout_id=inp.payout_id,
            account_id=inp.account_id,
            token=grant.token,
            context=self._context(inp, name, deadline_s),
            **kw,
        )

    async def _acquire(self, inp: m.PayoutInput) -> m.AcquireResult | None:
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
                    context=self._context(inp, "acquire"),
                ),
                start_to_close_timeout=timedelta(seconds=inp.acquire_wait_s + 5),
                heartbeat_timeout=timedelta(seconds=inp.holder_heartbeat_timeout_s),
                # The SDK already retries transport errors a bounded number of times with
                # jitter; the workflow's own backoff handles the rest. One attempt here.
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            self._contended = False
            self._last_error = f"acquire failed: {cause(err)}"
            return None
        self._contended = result.reason in ("held", "timeout")
        if not result.acquired:
            self._last_error = f"lock not acquired: {result.reason}"
            return None
        self._token = result.token
        return result

    async def _acquire_and_execute(self, inp: m.PayoutInput) -> m.RunResult | None:
        """The two-task path's one activity: the acquire, and under its grant the merged holder
        step, in the worker that got the grant.

        What prevents a double payout: ONE attempt (`SUBMIT_ONCE`), because the activity may
        reach the submit; inside it is execute_payout, which submits only a payout it claimed
        from PENDING itself (the activity's docstring has the rest). None: the activity itself
        failed (a worker died or froze in it: its grant, if any, has an older token than the
        next one, and the fences refuse it), so the next acquire comes soon."""
        try:
            run: m.RunResult = await workflow.execute_activity_method(
                PayoutActivities.acquire_and_execute,
                m.RunRequest(
                    acquire=m.AcquireRequest(
                        payout_id=inp.payout_id,
                        account_id=inp.account_id,
                        wait_s=inp.acquire_wait_s,
                        context=self._context(inp, "execute"),
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
            self._contended = isinstance(err.cause, ActivityTimeout)
            self._last_error = f"acquire and execute failed: {cause(err)}"
            return None
        grant = run.grant
        self._contended = grant.reason in ("held", "timeout")
        if not grant.acquired:
            self._last_error = f"lock not acquired: {grant.reason}"
        else:
            self._token = grant.token
        return run

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
        self._observe(view)
        return view

    def _observe(self, view: m.PayoutView) -> None:
        self._state = view.state
        self._amount = view.amount or self._amount
        self._failure_reason = view.failure_reason or self._failure_reason
        self._client_reference = view.client_reference or self._client_reference
        if view.attempt is not None:
            self._attempt = view.attempt
        self._publish()

    def _show(self) -> None:
        """Refresh what the Temporal UI shows of the payout (workflows.details). Not a command:
        replay is unaffected, and it costs no history event."""
        workflow.set_current_details(
            current_details(
                Snapshot(
                    payout_id=self._input.payout_id,
                    account_id=self._input.account_id,
                    amount=self._amount,
                    state=self._state,
                    step=self._step_name,
                    token=self._token,
                    escalated=self._escalated,
                    resolution=self._resolution,
                    evidence=self._evidence,
                    failure_reason=self._failure_reason,
                    lookups=self._lookups_before + self._lookups,
                    last_lookup=self._last_lookup,
                    commands=self._desk.records(),
                    cancel_requests=self._desk.cancel_requests,
                    last_error=self._last_error,
                )
            )
        )

    def _publish(self) -> None:
        """Upsert state, account and escalation as search attributes when they differ from the
        workflow's own, so that operators find payouts by state in the Temporal UI and CLI
        (workflows.search_attributes); the starter sets all three, so the middle of a payout
        upserts nothing (one visibility write less per workflow task, issue 16)."""
        self._show()
        changed = changed_search_attributes(
            workflow.info().typed_search_attributes,
            self._state,
            self._input.account_id,
            self._escalated,
        )
        if changed:
            workflow.upsert_search_attributes([p.key.value_set(p.value) for p in changed])

    # ------------------------------------------------------------------ the critical section

    async def _critical_section(
        self, inp: m.PayoutInput, grant: m.AcquireResult, run: m.RunResult | None = None
    ) -> bool:
        """Run the steps the payout's state calls for, under one grant. Returns whether the
        payout progressed (False: retry later after a backoff). `run`: what acquire_and_execute
        already did under this grant (the two-task path), in place of execute_payout."""
        holder_timed_out = False
        released = False  # by execute_payout, at the end of its last step
        try:
            if run is not None and run.failure is not None:
                return self._section_failed(grant, run.failure.type, run.failure.message)
            if run is not None and run.view is not None:
                view = run.view
                self._observe(view)
            else:
                view = await self._execute(inp, grant)
            released = view.released
            if "submit" in view.steps and view.state == PayoutState.CLAIMED.value:
                # NOT_SUBMITTED (circuit open, admission full, ...): try again later, under a
                # new grant, by the state-based path (which reads the attempt record first).
                self._last_error = f"not submitted: {view.detail}"
                return False
            return await self._advance(inp, grant, view)
        except ActivityError as err:
            # A timeout means the holder's worker died or stalled: re-acquire at once, and
            # recovery reads the state afresh. Anything else: back off before the next try.
            holder_timed_out = isinstance(err.cause, ActivityTimeout)
            kind = err.cause.type or "" if isinstance(err.cause, ApplicationError) else ""
            return self._section_failed(grant, kind, cause(err)) or holder_timed_out
        finally:
            if not released:
                await self._release_after_section(inp, grant, holder_timed_out)

    async def _release_after_section(
        self, inp: m.PayoutInput, grant: m.AcquireResult, holder_timed_out: bool
    ) -> None:
        if not holder_timed_out:
            await self._release(inp, grant)
            return
        # Not awaited: the run loop re-acquires at once. What prevents a double payout meanwhile
        # is fencing, not this release: the next grant has a higher token, and the paydb and the
        # proxy refuse the timed-out holder's writes under its own; the release itself is the
        # server's compare-and-delete on this grant's (key, session, token), so it can never end
        # the next one.
        self._background_releases.append(asyncio.create_task(self._release(inp, grant, short=True)))

    def _section_failed(self, grant: m.AcquireResult, kind: str, why: str) -> bool:
        """A failed critical-section step: True when the grant is lost (fenced out, lock lost):
        never retried under the same token, re-acquired at once."""
        self._last_error = why
        if kind in (m.FENCED_OUT, m.LOCK_LOST):
            workflow.logger.warning("grant %s lost: %s", grant.token, why)
            return True
        return False

    async def _execute(self, inp: m.PayoutInput, grant: m.AcquireResult) -> m.PayoutView:
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
            self._step(inp, grant, "execute"),
            grant.worker_queue,
            SUBMIT_ONCE,
            summary=EXECUTE_SUMMARY,
        )

    async def _advance(
        self, inp: m.PayoutInput, grant: m.AcquireResult, view: m.PayoutView
    ) -> bool:
        queue = grant.worker_queue
        while True:
            step = next_step(view)
            if step is Next.DONE:
                return True
            if step is Next.SUBMIT:
                # The proxy's record proves nothing was handed off (FR-24); the proxy itself
                # refuses a second attempt for this payout (FR-18), and the submit is one
                # attempt (`SUBMIT_ONCE`), so even a wrong decision here cannot pay twice.
                view = await self._on_holder(
                    PayoutActivities.submit_to_rail,
                    self._step(inp, grant, "submit"),
                    queue,
                    SUBMIT_ONCE,
                )
                if view.state == PayoutState.CLAIMED.value:
                    # NOT_SUBMITTED (circuit open, admission full, ...): try again later.
                    self._last_error = f"not submitted: {view.detail}"
                    return False
            elif step is Next.RECOVER:
                # Recovery by evidence: the attempt's recorded outcome decides; an attempt with
                # no outcome becomes RAIL_AMBIGUOUS and is never resubmitted (UC-04, FR-23).
                view = await self._on_holder(
                    PayoutActivities.recover_from_attempt,
                    self._step(inp, grant, "recover"),
                    queue,
                    DB_WRITE_RETRY,
                )
            elif step is Next.POST:
                view = await self._on_holder(
                    PayoutActivities.post_to_ledger,
                    self._step(inp, grant, "post"),
                    queue,
                    DB_WRITE_RETRY,
                )
            elif step is Next.AMBIGUOUS:
                resolved = await self._ambiguous_step(inp, grant)
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
                self._last_error = f"unexpected payout state {view.state}"
                workflow.logger.error("unexpected payout state %s", view.state)
                return False

    async def _ambiguous_step(
        self, inp: m.PayoutInput, grant: m.AcquireResult
    ) -> m.PayoutView | None:
        """RAIL_AMBIGUOUS under a grant. Evidence outranks any command: a rail outcome already
        known is applied, and a pending abandon is refused naming it; otherwise a pending
        abandon is carried out, unless the abandon activity's own last lookup finds the rail's
        evidence first. None: nothing to do under this grant."""
        pending = self._desk.pending_abandon()
        if not self._resolution and pending is not None:
            view = await self._abandon_under(inp, grant, pending)
            if not view.evidence:
                if view.state == PayoutState.ABANDONED.value:
                    self._desk.carried_out(pending, "ABANDONED")
                return view
            self._learn(view.evidence, "the abandon's last lookup")
        if not self._resolution:
            return None
        if pending is not None and pending.status == "pending":
            why = f"the rail's evidence came first ({self._evidence}): abandon refused"
            await self._desk.refuse(pending, why, code="evidence")
        return await self._apply_resolution(inp, grant)

    async def _apply_resolution(self, inp: m.PayoutInput, grant: m.AcquireResult) -> m.PayoutView:
        view = await self._on_holder(
            PayoutActivities.resolve_ambiguous,
            self._step(inp, grant, "resolve", resolution=self._resolution),
            grant.worker_queue,
            DB_WRITE_RETRY,
        )
        self._resolution = ""
        return view

    async def _abandon_under(
        self, inp: m.PayoutInput, grant: m.AcquireResult, pending: m.CommandRecord
    ) -> m.PayoutView:
        """The accepted abandon, carried out by the payment store under this grant and under
        the acceptance it recorded (so an assertion that expired meanwhile does not matter)."""
        try:
            return await self._on_holder(
                PayoutActivities.abandon_payout,
                self._step(
                    inp,
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
            await self._desk.refuse(pending, f"abandon refused: {cause(err)}", code="refused")
            return m.PayoutView(
                payout_id=inp.payout_id, account_id=inp.account_id, state=self._state
            )

    def _learn(self, status: str, source: str) -> None:
        """A rail outcome, from a lookup: settled -> RAIL_ACKED; declined or proven absent ->
        FAILED. Applied under the next grant; from now on an abandon is refused naming it."""
        self._resolution = "settled" if status == "settled" else "absent"
        self._evidence = f"{source} at {workflow.now().isoformat()}: {status}"

    async def _release(
        self, inp: m.PayoutInput, grant: m.AcquireResult, *, short: bool = False
    ) -> None:
        # `short`: the holder just timed out (frozen, dead or stalled). Its frozen long-poll may
        # take this task too, so one attempt bounded by the heartbeat timeout, not two of 10 s
        # (21 s of a 45 s takeover, issue 16). A release that does not happen here only delays
        # the next holder, never safety: the holder's idle sweeper gives the grant back, a dead
        # holder's session expires, and a release the lock server did not answer stays pending
        # in the holder's SDK, retried until it succeeds or the session ends (issue 24, item 6).
        limit = min(10.0, inp.holder_heartbeat_timeout_s) if short else 10.0
        try:
            await workflow.execute_activity_method(
                PayoutActivities.release_lock,
                self._step(inp, grant, "release"),
                task_queue=grant.worker_queue,
                schedule_to_start_timeout=timedelta(seconds=inp.holder_pickup_s),
                start_to_close_timeout=timedelta(seconds=limit),
                retry_policy=RetryPolicy(maximum_attempts=1 if short else 2),
            )
        except ActivityError as err:
            # A lost release only delays the next holder (see above); safety never depends on it
            # (the next grant has a higher token).
            workflow.logger.info("release of token %s failed: %s", grant.token, cause(err))

    async def _background_releases_done(self) -> None:
        releases, self._background_releases = self._background_releases, []
        for release in releases:
            await release  # `_release` never raises: a failed release is only logged

    # ------------------------------------------------------------------ ambiguity (UC-05)

    def _resolution_known(self) -> bool:
        return bool(self._resolution) or self._abandon_waiting()

    def _abandon_waiting(self) -> bool:
        return self._desk.pending_abandon() is not None

    async def _resolve_ambiguity(self, inp: m.PayoutInput) -> None:
        """Lookups by client reference on durable timers until the rail's evidence settles it,
        or, past the resolution SLA, an operator abandons it. Never resubmits. Returns early when
        the run is due to continue as new."""
        if self._ambiguous_since is None:
            # The SLA runs from the first lookup of the first run, not of the latest run.
            self._ambiguous_since = workflow.now()
        while not self._resolution_known():
            if self._continue_as_new_due():
                return
            result = await self._lookup(inp)
            if result.status in ("settled", "absent", "declined"):
                self._learn(result.status, f"lookup {self._last_lookup_number()}")
                return
            waited = (workflow.now() - self._ambiguous_since).total_seconds()
            if not self._escalated and waited >= inp.resolution_sla_s:
                await self._escalate(inp)
            # A durable timer: the next lookup, or an operator's abandon, whichever comes first.
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    self._abandon_waiting,
                    timeout=timedelta(seconds=inp.lookup_interval_s),
                    timeout_summary=f"next lookup of the rail in {inp.lookup_interval_s:g}s "
                    "(sooner for an accepted abandon)",
                )

    async def _lookup(self, inp: m.PayoutInput) -> m.LookupResult:
        self._lookups += 1
        try:
            result: m.LookupResult = await workflow.execute_activity_method(
                PayoutActivities.lookup_rail,
                m.LookupRequest(
                    payout_id=inp.payout_id,
                    client_reference=self._client_reference,
                    context=self._context(inp, "lookup"),
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=unlimited_retry(inp),
            )
        except ActivityError as err:
            # Only a non-retryable failure gets here. Not evidence of anything: look again later.
            self._last_error = f"lookup failed: {cause(err)}"
            result = m.LookupResult(status="unavailable", detail=self._last_error)
        self._last_lookup = m.LookupRecord(
            number=self._last_lookup_number(),
            status=result.status,
            detail=result.detail[:500],
            at=workflow.now().isoformat(),
        )
        self._show()
        return result

    def _last_lookup_number(self) -> int:
        return self._lookups_before + self._lookups

    async def _escalate(self, inp: m.PayoutInput) -> None:
        # Escalated from here on, whether or not the alert's audit row is written: the SLA has
        # passed, so an operator may abandon.
        self._escalated = True
        self._publish()
        try:
            await workflow.execute_activity_method(
                PayoutActivities.escalate_ambiguous,
                m.StepRequest(
                    payout_id=inp.payout_id,
                    account_id=inp.account_id,
                    token=self._token,
                    context=self._context(inp, "escalate"),
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=unlimited_retry(inp),
            )
        except ActivityError as err:
            self._last_error = f"escalation not recorded: {cause(err)}"
