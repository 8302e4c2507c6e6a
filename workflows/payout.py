"""PayoutWorkflow: one payout, executed exactly once, following UC-01 step by step.

Each step is a named activity so the Temporal UI shows a payout's progress: acquire lock,
re-read and claim, submit, post, release. Recovery (UC-04, FR-24) is decided by the payout's
state and the rail proxy's attempt record, never by elapsed time. RAIL_AMBIGUOUS is resolved only
by lookups by client reference or by an operator (UC-05).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from ledger.states import TERMINAL_STATES, PayoutState

# Database writes before handoff may be retried a few times; fenced rejections never are.
_DB_WRITE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=3,
    non_retryable_error_types=[m.FENCED_OUT, m.LOCK_LOST, m.INVALID_TRANSITION, m.UNKNOWN_PAYOUT],
)
# The submit activity is NEVER retried (UC-05, STD01-07): a retry after a possible handoff is a
# second payment, because the rail has no idempotency key. A failed or timed-out submit goes to
# state-based recovery instead, which reads the proxy's attempt record as evidence.
_SUBMIT_ONCE = RetryPolicy(maximum_attempts=1)
_READ_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=4,
)


@workflow.defn(name="PayoutWorkflow")
class PayoutWorkflow:
    def __init__(self) -> None:
        self._state = PayoutState.PENDING.value
        self._token = 0
        self._attempt: m.AttemptView | None = None
        self._client_reference = ""
        self._escalated = False
        self._abandon: m.OperatorCommand | None = None
        self._rejections: list[m.SignalRejection] = []
        self._last_error = ""
        self._steps = 0
        self._input: m.PayoutInput | None = None
        self._resolution = ""  # "settled" or "absent", from the rail's lookup evidence
        self._contended = False  # the last acquire found the key held by another grant

    # ------------------------------------------------------------------ entry point

    @workflow.run
    async def run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        self._input = inp
        backoff_round = 0
        while self._state not in TERMINAL_STATES:
            if self._state == PayoutState.RAIL_AMBIGUOUS.value and not self._resolution_known():
                await self._resolve_ambiguity(inp)
                continue
            grant = await self._acquire(inp)
            if grant is None:
                # Fail closed (UC-08, FR-27): no grant, no execution. The payout stays as it is
                # and we try again after a jittered backoff: no thundering herd. Contention (the
                # account's other payout holds the lock) is normal: the acquire already waited
                # its budget, so retry soon; an unavailable lock service backs off exponentially.
                if self._contended:
                    await workflow.sleep(self._backoff(inp, 0))
                else:
                    backoff_round += 1
                    await workflow.sleep(self._backoff(inp, backoff_round))
                continue
            progressed = await self._critical_section(inp, grant)
            if progressed:
                backoff_round = 0
            else:
                backoff_round += 1
                await workflow.sleep(self._backoff(inp, backoff_round))
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    # ------------------------------------------------------------------ queries and signals

    @workflow.query
    def status(self) -> m.PayoutStatus:
        return m.PayoutStatus(
            payout_id=self._input.payout_id if self._input else "",
            state=self._state,
            token=self._token,
            attempt=self._attempt,
            escalated=self._escalated,
            rejected_signals=list(self._rejections),
            last_error=self._last_error,
        )

    @workflow.signal
    async def abandon(self, cmd: m.OperatorCommand) -> None:
        """Operator: RAIL_AMBIGUOUS -> ABANDONED, only after the resolution SLA escalated."""
        why = _missing_identity(cmd)
        if not why and self._state != PayoutState.RAIL_AMBIGUOUS.value:
            why = f"abandon is only valid in RAIL_AMBIGUOUS, payout is {self._state}"
        if not why and not self._escalated:
            why = "abandon is only valid after the resolution SLA has escalated"
        if why:
            await self._reject("abandon", cmd, why)
            return
        self._abandon = cmd

    @workflow.signal
    async def revoke(self, cmd: m.OperatorCommand) -> None:
        """Operator: force-revoke this payout's lock through the lock service (UC-06)."""
        why = _missing_identity(cmd)
        if not why and self._state in TERMINAL_STATES:
            why = f"payout is terminal ({self._state}); nothing to revoke"
        if why:
            await self._reject("revoke", cmd, why)
            return
        assert self._input is not None
        await workflow.execute_activity(
            m.REVOKE_LOCK,
            m.RevokeRequest(
                account_id=self._input.account_id,
                operator=cmd.operator,
                reason=cmd.reason,
                payout_id=self._input.payout_id,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_READ_RETRY,
        )

    async def _reject(self, signal: str, cmd: m.OperatorCommand, why: str) -> None:
        rejection = m.SignalRejection(
            signal=signal, operator=cmd.operator, reason=cmd.reason, why=why
        )
        self._rejections.append(rejection)
        workflow.logger.warning("operator signal rejected: %s (%s)", signal, why)
        # The rejection is audited like any operator action (FR-30); failing to audit it must
        # not fail the workflow, so the activity's own failure is swallowed after its retries.
        try:
            await workflow.execute_activity(
                m.RECORD_SIGNAL_REJECTED,
                rejection,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_READ_RETRY,
            )
        except ActivityError:
            workflow.logger.warning("could not audit the rejected %s signal", signal)

    # ------------------------------------------------------------------ steps

    def _context(
        self, inp: m.PayoutInput, step: str, deadline_s: float | None = None
    ) -> m.WorkContext:
        self._steps += 1
        info = workflow.info()
        deadline = None
        if deadline_s is not None:
            deadline = (workflow.now() + timedelta(seconds=deadline_s)).isoformat()
        return m.WorkContext(
            correlation_id=inp.correlation_id or inp.payout_id,
            causation_id=f"{info.workflow_id}:{info.run_id}:{step}:{self._steps}",
            deadline_at=deadline,
        )

    def _backoff(self, inp: m.PayoutInput, round_: int) -> timedelta:
        base = min(inp.max_backoff_s, inp.base_backoff_s * (2 ** min(round_, 16)))
        # Full jitter from the workflow's deterministic random source (replay-safe).
        return timedelta(seconds=max(0.05, base * workflow.random().uniform(0.5, 1.0)))

    async def _acquire(self, inp: m.PayoutInput) -> m.AcquireResult | None:
        try:
            result: m.AcquireResult = await workflow.execute_activity(
                m.ACQUIRE_LOCK,
                m.AcquireRequest(
                    payout_id=inp.payout_id,
                    account_id=inp.account_id,
                    wait_s=inp.acquire_wait_s,
                    context=self._context(inp, "acquire"),
                ),
                result_type=m.AcquireResult,
                start_to_close_timeout=timedelta(seconds=inp.acquire_wait_s + 5),
                # The SDK already retries transport errors a bounded number of times with
                # jitter; the workflow's own backoff handles the rest. One attempt here.
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            self._contended = False
            self._last_error = f"acquire failed: {_cause(err)}"
            return None
        self._contended = result.reason in ("held", "timeout")
        if not result.acquired:
            self._last_error = f"lock not acquired: {result.reason}"
            return None
        self._token = result.token
        return result

    async def _on_holder(
        self, activity: str, req: m.StepRequest, queue: str, retry: RetryPolicy
    ) -> m.PayoutView:
        assert self._input is not None
        # The critical-section activities run on the lock holder's own task queue. If that
        # worker dies, nothing polls the queue and schedule-to-start (or the heartbeat timeout,
        # mid-activity) fires; the workflow then re-acquires with a new, higher token.
        view: m.PayoutView = await workflow.execute_activity(
            activity,
            req,
            task_queue=queue,
            result_type=m.PayoutView,
            retry_policy=retry,
            schedule_to_start_timeout=timedelta(seconds=self._input.holder_pickup_s),
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=self._input.holder_heartbeat_timeout_s),
        )
        self._observe(view)
        return view

    def _observe(self, view: m.PayoutView) -> None:
        self._state = view.state
        self._client_reference = view.client_reference or self._client_reference
        if view.attempt is not None:
            self._attempt = view.attempt

    def _step(
        self, inp: m.PayoutInput, grant: m.AcquireResult, name: str, **kw: str
    ) -> m.StepRequest:
        deadline_s = inp.submit_deadline_s if name == "submit" else None
        return m.StepRequest(
            payout_id=inp.payout_id,
            account_id=inp.account_id,
            token=grant.token,
            context=self._context(inp, name, deadline_s),
            **kw,
        )

    async def _critical_section(self, inp: m.PayoutInput, grant: m.AcquireResult) -> bool:
        """Run the steps the payout's state calls for, under one grant. Returns whether the
        payout progressed (False: retry later after a backoff)."""
        queue = grant.worker_queue
        try:
            # FR-14: re-read after acquiring; holding the lock does not mean there is work.
            view = await self._on_holder(
                m.REREAD_AND_CLAIM, self._step(inp, grant, "claim"), queue, _DB_WRITE_RETRY
            )
            return await self._advance(inp, grant, view)
        except ActivityError as err:
            self._last_error = _cause(err)
            if _is_type(err, m.FENCED_OUT) or _is_type(err, m.LOCK_LOST):
                # Never retry under the same token: abort this attempt and re-acquire.
                workflow.logger.warning("grant %s lost: %s", grant.token, self._last_error)
                return True
            # A timeout means the holder's worker died or stalled: re-acquire at once, and
            # recovery reads the state afresh. Anything else: back off before the next try.
            return isinstance(err.cause, ActivityTimeout)
        finally:
            await self._release(inp, grant)

    async def _advance(
        self, inp: m.PayoutInput, grant: m.AcquireResult, view: m.PayoutView
    ) -> bool:
        queue = grant.worker_queue
        while True:
            state = view.state
            if state in TERMINAL_STATES:
                return True
            if state == PayoutState.CLAIMED.value:
                attempt = view.attempt
                if attempt is None or attempt.outcome == "NOT_SUBMITTED":
                    # Safe to submit: the proxy's record proves nothing was handed off
                    # (FR-24). The proxy itself refuses a second attempt for this payout
                    # (FR-18), so even a wrong decision here cannot pay twice.
                    view = await self._on_holder(
                        m.SUBMIT_TO_RAIL, self._step(inp, grant, "submit"), queue, _SUBMIT_ONCE
                    )
                    if view.state == PayoutState.CLAIMED.value:
                        # NOT_SUBMITTED (circuit open, admission full, ...): try again later.
                        self._last_error = f"not submitted: {view.detail}"
                        return False
                    continue
                view = await self._on_holder(
                    m.RECOVER_FROM_ATTEMPT,
                    self._step(inp, grant, "recover"),
                    queue,
                    _DB_WRITE_RETRY,
                )
                continue
            if state == PayoutState.RAIL_SUBMITTED.value:
                # Recovery by evidence: the attempt's recorded outcome decides; an attempt with
                # no outcome becomes RAIL_AMBIGUOUS and is never resubmitted (UC-04, FR-23).
                view = await self._on_holder(
                    m.RECOVER_FROM_ATTEMPT,
                    self._step(inp, grant, "recover"),
                    queue,
                    _DB_WRITE_RETRY,
                )
                continue
            if state == PayoutState.RAIL_ACKED.value:
                view = await self._on_holder(
                    m.POST_TO_LEDGER, self._step(inp, grant, "post"), queue, _DB_WRITE_RETRY
                )
                continue
            if state == PayoutState.RAIL_AMBIGUOUS.value:
                if self._abandon is not None:
                    view = await self._on_holder(
                        m.ABANDON_PAYOUT,
                        self._step(
                            inp,
                            grant,
                            "abandon",
                            operator=self._abandon.operator,
                            reason=self._abandon.reason,
                        ),
                        queue,
                        _DB_WRITE_RETRY,
                    )
                    continue
                if self._resolution:
                    view = await self._on_holder(
                        m.RESOLVE_AMBIGUOUS,
                        self._step(inp, grant, "resolve", resolution=self._resolution),
                        queue,
                        _DB_WRITE_RETRY,
                    )
                    self._resolution = ""
                    continue
                return True  # release the lock; resolve by lookups outside the critical section
            if state == PayoutState.PENDING.value:
                # The claim did not happen (e.g. another holder's work in flight): retry later.
                return False
            raise ApplicationError(f"unexpected payout state {state}", non_retryable=True)

    async def _release(self, inp: m.PayoutInput, grant: m.AcquireResult) -> None:
        try:
            await workflow.execute_activity(
                m.RELEASE_LOCK,
                self._step(inp, grant, "release"),
                task_queue=grant.worker_queue,
                schedule_to_start_timeout=timedelta(seconds=inp.holder_pickup_s),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        except ActivityError as err:
            # A lost release only delays the next holder until the lease expires; safety never
            # depends on it (the next grant has a higher token).
            workflow.logger.info("release of token %s failed: %s", grant.token, _cause(err))

    # ------------------------------------------------------------------ ambiguity (UC-05)

    def _resolution_known(self) -> bool:
        return bool(self._resolution) or self._abandon is not None

    async def _resolve_ambiguity(self, inp: m.PayoutInput) -> None:
        """Bounded lookups by client reference on durable timers until the rail's evidence
        settles it, or, past the resolution SLA, an operator abandons it. Never resubmits."""
        started = workflow.now()
        while not self._resolution_known():
            result: m.LookupResult = await workflow.execute_activity(
                m.LOOKUP_RAIL,
                m.LookupRequest(
                    payout_id=inp.payout_id,
                    client_reference=self._client_reference,
                    context=self._context(inp, "lookup"),
                ),
                result_type=m.LookupResult,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=_READ_RETRY,
            )
            if result.status == "settled":
                self._resolution = "settled"
                return
            if result.status in ("absent", "declined"):
                self._resolution = "absent"
                return
            waited = (workflow.now() - started).total_seconds()
            if not self._escalated and waited >= inp.resolution_sla_s:
                self._escalated = True
                await workflow.execute_activity(
                    m.ESCALATE_AMBIGUOUS,
                    m.StepRequest(
                        payout_id=inp.payout_id,
                        account_id=inp.account_id,
                        token=self._token,
                        context=self._context(inp, "escalate"),
                    ),
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=_READ_RETRY,
                )
            # A durable timer: the next lookup, or an operator's abandon, whichever comes first.
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._abandon is not None,
                    timeout=timedelta(seconds=inp.lookup_interval_s),
                )


def _missing_identity(cmd: m.OperatorCommand) -> str:
    if not cmd.operator or not cmd.operator.strip():
        return "an operator identity is required"
    if not cmd.reason or not cmd.reason.strip():
        return "a reason is required"
    return ""


def _cause(err: BaseException) -> str:
    cause = err.__cause__ or getattr(err, "cause", None)
    return f"{type(cause).__name__}: {cause}" if cause else str(err)


def _is_type(err: ActivityError, error_type: str) -> bool:
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == error_type
