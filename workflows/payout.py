"""PayoutWorkflow: one payout, executed exactly once, following UC-01 step by step.

Each UC-01 step stays identifiable in the Temporal UI: acquire lock, then (patch
`merged-holder-steps`) one holder activity `execute_payout` that re-reads and claims, submits,
posts and releases, naming its current step in its heartbeat details and the steps done in its
result; a payout found in flight goes on by the named state-based steps (recover, submit, post,
release). Histories recorded before the patch replay the separate steps. Recovery (UC-04,
FR-24) is decided by the payout's state and the rail proxy's attempt record, never by elapsed
time. RAIL_AMBIGUOUS is resolved only by lookups by client reference or by an operator (UC-05).

Owns: the order of the steps, their retry policies, the operator signals and the workflow's
history size (continue-as-new). Must never: retry the submit, fail for an infrastructure reason
(an outage of the lock service, the database, the rail or every worker only delays a payout,
docs/architecture.md#workflow-shape), or let an operator command that cannot be carried out
escape a signal handler.
See docs/workflow.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from ledger.states import TERMINAL_STATES, PayoutState
    from workflows.details import Snapshot, current_details
    from workflows.operator_desk import (
        Facts,
        OperatorDesk,
        cause,
        decode_signal,
        operator_command,
    )
    from workflows.search_attributes import PAYOUT_ACCOUNT, PAYOUT_ESCALATED, PAYOUT_STATE

# Patch ids (workflow.patched): each marks a change of the commands a workflow issues, so that
# histories recorded before it (the replay corpus, and runs in flight at a deploy) replay as
# they ran. Never rename one; remove the old branch only once no such history can exist.
#: A valid `revoke` is queued and carried out by a coroutine of the run, not inside the handler.
PATCH_QUEUED_REVOKE = "revoke-queued-outside-handler"
#: The run continues as new after `max_lookups_per_run` lookups or when Temporal suggests it.
PATCH_CONTINUE_AS_NEW = "continue-as-new"
#: State, account and escalation are upserted as search attributes at every change.
PATCH_SEARCH_ATTRIBUTES = "search-attributes"
#: The acquire activity has a heartbeat timeout: one taken by a frozen worker's open long-poll
#: times out in seconds instead of waiting out its whole start-to-close (issue 16, takeover).
PATCH_ACQUIRE_HEARTBEAT = "acquire-heartbeat"
#: After a holder step timed out, the release on that holder's queue is one attempt bounded by
#: the holder heartbeat timeout: a frozen worker's long-poll takes it and holds it for no longer.
PATCH_SHORT_RELEASE_AFTER_TIMEOUT = "short-release-after-holder-timeout"
#: That short release runs beside the next acquire instead of before it: a frozen holder's
#: long-poll takes it and holds it for the whole heartbeat timeout, and the next acquire needs
#: nothing from it (the server's wait ends when the frozen holder's session expires, or when the
#: release of a live holder arrives).
PATCH_RELEASE_BESIDE_REACQUIRE = "release-beside-reacquire-after-holder-timeout"
#: An abandon whose operator assertion the payment store refused is recorded as a rejected
#: signal (audit row + event) and dropped, instead of failing the critical section.
PATCH_VERIFIED_ABANDON = "abandon-assertion-refused"
#: The critical section starts with ONE holder activity, `execute_payout` (re-read and claim,
#: submit once, post, and the release once terminal), instead of `reread_and_claim` followed by
#: `submit_to_rail`, `post_to_ledger` and `release_lock`: 3 workflow tasks per payout instead
#: of 6 (issue 16). A payout found in flight goes on by the same state-based steps as before.
PATCH_MERGED_HOLDER = "merged-holder-steps"
#: Fewer visibility writes per payout (issue 16). Every first `workflow.patched` call of a run
#: also upserts the `TemporalChangeVersion` search attribute (the SDK does it), and Temporal
#: writes the visibility store once for each workflow task that upserts anything: the payout's
#: second task did so only for `merged-holder-steps`. With this patch that one is decided in
#: the first task, which upserts anyway, and only the search attributes whose value differs
#: from the workflow's own are upserted (the starter sets all three: payouts.workload).
PATCH_LEAN_VISIBILITY = "lean-visibility"
#: Operator commands (issue 24): one dynamic signal handler takes any name, arity and payload
#: (`workflows.operator_desk`); abandon and revoke are also Updates with a validator; each command
#: is verified once by the payment store (single-use nonce) and ended once, carried out or
#: refused; the rail's evidence outranks an abandon; a cancellation request is refused and the
#: payout goes on; continue-as-new waits for a revoke in flight instead of cancelling it.
PATCH_OPERATOR_COMMANDS = "operator-commands"
#: The two-task happy path (issue 29): the first workflow task schedules ONE activity on the shared
#: queue, `acquire_and_execute`, in which the worker that is granted the lock runs the merged
#: holder step itself: 2 workflow tasks and 1 activity per payout instead of 3 and 2. Anything
#: but the happy outcome goes on by the same state-based steps on that worker's queue.
PATCH_TWO_TASK = "acquire-and-execute"
#: What an operator sees as the merged activity's summary in the Temporal UI (UC-01 steps 3-9).
EXECUTE_SUMMARY = "UC-01: re-read + claim -> submit (once) -> post -> release"
RUN_SUMMARY = "UC-01: acquire -> re-read + claim -> submit (once) -> post -> release"
#: A critical-section activity of the lock holder's queue, by method reference (`_on_holder`).
HolderStep = Callable[[PayoutActivities, m.StepRequest], Awaitable[m.PayoutView]]

# Database writes before handoff may be retried a few times; fenced rejections never are. A write
# that still fails is not fatal: the critical section ends, the grant is released, and the run
# loop backs off, re-acquires and recovers by the payout's state.
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
#: The latest rejected signals handed to the next run (all of them are in the audit log).
_CARRIED_REJECTIONS = 50


def _unlimited_retry(inp: m.PayoutInput) -> RetryPolicy:
    """Reads, lookups, escalation, audit and revoke: no attempt limit, capped backoff.

    Why no limit (docs/architecture.md#workflow-shape): an outage of the database, the proxy, the
    lock service or every worker must only delay a payout. A bounded policy turned a few seconds of
    outage into a failed workflow, which REJECT_DUPLICATE then forbids restarting: the payout was
    stranded. These activities move no money, so repeating one is harmless; an attempt retried by
    Temporal adds no history event, so waiting out a long outage does not grow the history either.
    Errors an activity marks non-retryable (a refusal, not an outage) still end the attempt at once.
    """
    cap = max(0.1, inp.read_retry_max_interval_s)
    return RetryPolicy(
        initial_interval=timedelta(seconds=min(0.5, cap)),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=cap),
        maximum_attempts=0,  # unlimited
    )


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
        self._abandon: m.OperatorCommand | None = None
        self._revokes: list[m.OperatorCommand] = []  # accepted, not carried out yet
        self._revoker_stopped = False
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
        self._published: tuple[str, bool] | None = None  # search attributes last upserted
        self._evidence = ""  # what the rail said that decided `_resolution`
        self._lookups_before = 0  # lookups of this payout in the runs before this one
        self._last_lookup: m.LookupRecord | None = None
        self._amount = inp.amount  # from the starter; then from the payment database's view
        self._failure_reason: str | None = None
        self._step_name = ""  # the step it is at (the Temporal UI's current details)
        carried = inp.carried.commands if inp.carried is not None else []
        retry = _unlimited_retry(inp)
        self._desk = OperatorDesk(inp, self._facts, retry, carried, self._rejections)
        if inp.carried is not None:
            self._restore(inp.carried)

    # ------------------------------------------------------------------ entry point

    @workflow.run
    async def run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        if not self._commands_on():
            return await self._run(inp)  # histories recorded before patch `operator-commands`
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

    def _commands_on(self) -> bool:
        """Patch `operator-commands` (memoized by the SDK: the first call decides for the run)."""
        return workflow.patched(PATCH_OPERATOR_COMMANDS)

    async def _run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        if self._commands_on():
            revoker = asyncio.create_task(self._desk.run_revokes())
        else:
            revoker = asyncio.create_task(self._carry_out_revokes())
        if workflow.patched(PATCH_LEAN_VISIBILITY):
            # Decided here, in the first task, so its TemporalChangeVersion upsert joins this
            # task's visibility write instead of costing the next task one of its own.
            workflow.patched(PATCH_MERGED_HOLDER)
        # Decided once for the run, in its first task (`inp.two_task`: the A/B switch).
        two_task = inp.two_task and workflow.patched(PATCH_TWO_TASK)
        self._publish()
        backoff_round = 0
        while self._state not in TERMINAL_STATES:
            if self._continue_as_new_due():
                # A safe point: no critical section is open and no grant is held.
                await self._continue_as_new(revoker)
            if self._state == PayoutState.RAIL_AMBIGUOUS.value and not self._resolution_known():
                await self._resolve_ambiguity(inp)
                continue
            run = await self._acquire_and_execute(inp) if two_task else None
            grant = (run.grant if run.grant.acquired else None) if run else None
            if not two_task:
                grant = await self._acquire(inp)
            if grant is None:
                # Fail closed (UC-08, FR-27): no grant, no execution. The payout stays as it is
                # and we try again after a jittered backoff: no thundering herd. Contention (the
                # account's other payout holds the lock) is normal: the acquire already waited
                # its budget, so retry soon; an unavailable lock service backs off exponentially.
                if self._contended:
                    await workflow.sleep(
                        self._backoff(inp, 0), summary="the account's lock is held: try again"
                    )
                else:
                    backoff_round += 1
                    await workflow.sleep(
                        self._backoff(inp, backoff_round),
                        summary=f"backoff {backoff_round}: {self._last_error[:120]}",
                    )
                continue
            progressed = await self._critical_section(inp, grant, run)
            if progressed:
                backoff_round = 0
            else:
                backoff_round += 1
                await workflow.sleep(
                    self._backoff(inp, backoff_round),
                    summary=f"backoff {backoff_round}: {self._last_error[:120]}",
                )
        await self._drop_pending_revokes(revoker)
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
            pending_revokes=len(self._revokes) + self._desk.pending_revokes(),
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
        if self._commands_on():
            await self._desk.on_signal(name, args)
            return
        # Histories recorded before patch `operator-commands`: the named handlers of then,
        # which took one payload decoded by the SDK's default converter.
        payload, _ = decode_signal(args) if len(args) == 1 else (None, "")
        if name == "abandon":
            await self._legacy_abandon(payload)
        elif name == "revoke":
            await self._legacy_revoke(payload)

    # Updates: the same commands with the verdict sent back to the caller (`payouts payout
    # abandon|revoke`). The validator refuses what the payout's state does not allow before
    # anything enters the history; an accepted one is verified by the payment store, and a
    # refusal there fails the update (type OperatorCommandRefused), never the workflow.

    @workflow.update(name="abandon", description="RAIL_AMBIGUOUS -> ABANDONED, after the SLA")
    async def abandon_update(self, cmd: m.OperatorCommand) -> m.CommandRecord:
        self._commands_on()
        return await self._desk.on_update("abandon", cmd)

    @abandon_update.validator
    def _validate_abandon(self, cmd: m.OperatorCommand) -> None:
        self._desk.validate("abandon", cmd)

    @workflow.update(name="revoke", description="force-revoke this payout's lock (UC-06)")
    async def revoke_update(self, cmd: m.OperatorCommand) -> m.CommandRecord:
        self._commands_on()
        return await self._desk.on_update("revoke", cmd)

    @revoke_update.validator
    def _validate_revoke(self, cmd: m.OperatorCommand) -> None:
        self._desk.validate("revoke", cmd)

    async def _legacy_abandon(self, payload: Any) -> None:
        """Before patch `operator-commands`: RAIL_AMBIGUOUS -> ABANDONED after the SLA."""
        cmd, why = operator_command(payload)
        if not why and self._state != PayoutState.RAIL_AMBIGUOUS.value:
            why = f"abandon is only valid in RAIL_AMBIGUOUS, payout is {self._state}"
        if not why and not self._escalated:
            why = "abandon is only valid after the resolution SLA has escalated"
        if why:
            await self._reject("abandon", cmd, why)
            return
        # Carried out by the run loop under a grant (abandon_payout is a fenced write).
        self._abandon = cmd

    async def _legacy_revoke(self, payload: Any) -> None:
        """Before patch `operator-commands`: force-revoke through the lock service."""
        cmd, why = operator_command(payload)
        if not why and self._state in TERMINAL_STATES:
            why = f"payout is terminal ({self._state}); nothing to revoke"
        if why:
            await self._reject("revoke", cmd, why)
            return
        if workflow.patched(PATCH_QUEUED_REVOKE):
            # Queued, and carried out by `_carry_out_revokes` with unlimited retries: a revoke
            # sent while the lock service is down is carried out when it returns, and a pending
            # one survives continue-as-new. The handler itself finishes at once.
            self._revokes.append(cmd)
            return
        # Histories recorded before the patch ran the revoke inside the handler: replay them as
        # they ran, but let no failure out of the handler.
        try:
            await self._revoke_now(cmd)
        except ActivityError as err:
            await self._reject("revoke", cmd, f"revoke could not be carried out: {cause(err)}")

    async def _reject(self, signal: str, cmd: m.OperatorCommand, why: str) -> None:
        rejection = m.SignalRejection(
            signal=signal, operator=cmd.operator, reason=cmd.reason, why=why
        )
        self._rejections.append(rejection)
        workflow.logger.warning("operator signal rejected: %s (%s)", signal, why)
        # The rejection is audited like any operator action (FR-30), retried until the database
        # takes it; a non-retryable failure is reported in the status, never raised.
        try:
            await workflow.execute_activity_method(
                PayoutActivities.record_signal_rejected,
                rejection,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_unlimited_retry(self._input),
            )
        except ActivityError as err:
            self._last_error = f"could not audit the rejected {signal} signal: {cause(err)}"

    # ------------------------------------------------------------------ operator revokes

    async def _revoke_now(self, cmd: m.OperatorCommand) -> None:
        await workflow.execute_activity_method(
            PayoutActivities.revoke_lock,
            m.RevokeRequest(
                account_id=self._input.account_id,
                operator=cmd.operator,
                reason=cmd.reason,
                payout_id=self._input.payout_id,
                # Verified by the lock server, which audits the identity inside (or refuses:
                # a non-retryable failure, reported as a rejected signal).
                assertion=cmd.assertion,
            ),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_unlimited_retry(self._input),
        )

    async def _carry_out_revokes(self) -> None:
        """Carry out queued revokes one by one, for as long as the run lasts.

        A command leaves the queue only once it is carried out or refused for good (the lock
        service rejected it: recorded as a signal rejection). Cancelled (continue-as-new, or the
        payout became terminal), the command in flight stays queued.
        """
        while True:
            await workflow.wait_condition(lambda: bool(self._revokes) or self._revoker_stopped)
            if self._revoker_stopped:
                return  # the cancellation was absorbed by an audit activity in `_reject`
            cmd = self._revokes[0]
            try:
                await self._revoke_now(cmd)
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    return
                self._revokes.pop(0)
                await self._reject("revoke", cmd, f"revoke could not be carried out: {cause(err)}")
                continue
            self._revokes.pop(0)

    async def _stop(self, revoker: asyncio.Task[None], *, terminal: bool = False) -> None:
        if self._commands_on():
            # Before continuing as new, never cancelled mid-revoke (issue 24, item 7): the one
            # in flight ends first, so it is neither lost nor carried out again by the next run.
            await self._desk.stop(revoker, cancel_in_flight=terminal)
            return
        self._revoker_stopped = True
        revoker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await revoker

    async def _drop_pending_revokes(self, revoker: asyncio.Task[None]) -> None:
        """The payout is terminal: a revoke not carried out by now is reported, not carried out,
        because the account's lock may already belong to its next payout."""
        await self._stop(revoker, terminal=True)
        if self._commands_on():
            await self._desk.drop_pending_revokes(self._state)
            await self._end_pending_abandon()
            return
        while self._revokes:
            cmd = self._revokes.pop(0)
            await self._reject(
                "revoke", cmd, f"payout reached {self._state} before the revoke was carried out"
            )

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
        due = (
            self._lookups >= max(1, self._input.max_lookups_per_run)
            or workflow.info().is_continue_as_new_suggested()
        )
        # Checked last, so that the patch marker is written only when a run does continue as new.
        return due and workflow.patched(PATCH_CONTINUE_AS_NEW)

    async def _continue_as_new(self, revoker: asyncio.Task[None]) -> None:
        """Hand the payout to a fresh run with an empty history, carrying what only the workflow
        knows. Called only between critical sections, so no grant is held across the gap."""
        await self._stop(revoker)  # legacy: a revoke in flight stays queued and is carried
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
            abandon=self._abandon,
            pending_revokes=list(self._revokes),
            # Every rejection is audited in the payment database; the carried list only feeds the
            # status query, so a flood of bad signals cannot grow the next run's input unbounded.
            rejected_signals=self._rejections[-_CARRIED_REJECTIONS:],
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
        self._abandon = c.abandon
        self._revokes = list(c.pending_revokes)
        self._rejections = list(c.rejected_signals)
        self._last_error = c.last_error
        self._runs = c.runs + 1
        self._evidence = c.evidence
        self._lookups_before = c.lookups
        self._last_lookup = c.last_lookup
        self._desk.cancel_requests = c.cancel_requests

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

    def _backoff(self, inp: m.PayoutInput, round_: int) -> timedelta:
        base = min(inp.max_backoff_s, inp.base_backoff_s * (2 ** min(round_, 16)))
        # Full jitter from the workflow's deterministic random source (replay-safe).
        return timedelta(seconds=max(0.05, base * workflow.random().uniform(0.5, 1.0)))

    async def _acquire(self, inp: m.PayoutInput) -> m.AcquireResult | None:
        # A frozen (SIGSTOPped) worker's open long-poll still receives this task; without a
        # heartbeat timeout the task then waits out acquire_wait_s + 5 s before another worker
        # may try. The activity heartbeats while it waits on the lock server. Money cannot move
        # twice through this: a grant obtained by an attempt Temporal already timed out goes to
        # nobody (the worker, which completes the activity itself, hears Temporal refuse the
        # answer and releases it at once), and a later grant has a higher token.
        heartbeat = None
        if workflow.patched(PATCH_ACQUIRE_HEARTBEAT):
            heartbeat = timedelta(seconds=inp.holder_heartbeat_timeout_s)
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
                heartbeat_timeout=heartbeat,
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
        """Upsert state, account and escalation as search attributes when they changed, so that
        operators find payouts by state in the Temporal UI and CLI (workflows.search_attributes).
        Histories recorded before this patch replay without the upserts."""
        self._show()
        now = (self._state, self._escalated)
        if now == self._published or not workflow.patched(PATCH_SEARCH_ATTRIBUTES):
            return
        self._published = now
        wanted: list[SearchAttributePair[Any]] = [
            SearchAttributePair(PAYOUT_STATE, self._state),
            SearchAttributePair(PAYOUT_ACCOUNT, self._input.account_id),
            SearchAttributePair(PAYOUT_ESCALATED, self._escalated),
        ]
        if workflow.patched(PATCH_LEAN_VISIBILITY):
            # What the workflow carries already: set at its start, or by an earlier upsert
            # (the SDK updates `info` with every upsert, on replay too).
            have = workflow.info().typed_search_attributes
            wanted = [p for p in wanted if have.get(p.key) != p.value]
            if not wanted:
                return
        workflow.upsert_search_attributes([p.key.value_set(p.value) for p in wanted])

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

    async def _critical_section(
        self, inp: m.PayoutInput, grant: m.AcquireResult, run: m.RunResult | None = None
    ) -> bool:
        """Run the steps the payout's state calls for, under one grant. Returns whether the
        payout progressed (False: retry later after a backoff). `run`: what acquire_and_execute
        already did under this grant (the two-task path), in place of execute_payout."""
        queue = grant.worker_queue
        holder_timed_out = False
        released = False  # by execute_payout, at the end of its last step
        try:
            if run is not None and run.failure is not None:
                return self._section_failed(grant, run.failure.type, run.failure.message)
            if run is not None or workflow.patched(PATCH_MERGED_HOLDER):
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
            else:
                # FR-14: re-read after acquiring; holding the lock does not mean there is work.
                view = await self._on_holder(
                    PayoutActivities.reread_and_claim,
                    self._step(inp, grant, "claim"),
                    queue,
                    _DB_WRITE_RETRY,
                )
            return await self._advance(inp, grant, view)
        except ActivityError as err:
            # A timeout means the holder's worker died or stalled: re-acquire at once, and
            # recovery reads the state afresh. Anything else: back off before the next try.
            holder_timed_out = isinstance(err.cause, ActivityTimeout)
            kind = err.cause.type or "" if isinstance(err.cause, ApplicationError) else ""
            return self._section_failed(grant, kind, cause(err)) or holder_timed_out
        finally:
            if not released:
                short = holder_timed_out and workflow.patched(PATCH_SHORT_RELEASE_AFTER_TIMEOUT)
                if short and workflow.patched(PATCH_RELEASE_BESIDE_REACQUIRE):
                    # Not awaited: the run loop re-acquires at once. What prevents a double payout
                    # meanwhile is fencing, not this release: the next grant has a higher token,
                    # and the paydb and the proxy refuse the timed-out holder's writes under its
                    # own; the release itself is the server's compare-and-delete on this grant's
                    # (key, session, token), so it can never end the next one.
                    self._background_releases.append(
                        asyncio.create_task(self._release(inp, grant, short=True))
                    )
                else:
                    await self._release(inp, grant, short=short)

    def _section_failed(self, grant: m.AcquireResult, kind: str, why: str) -> bool:
        """A failed critical-section step: True when the grant is lost (fenced out, lock lost):
        never retried under the same token, re-acquired at once."""
        self._last_error = why
        if kind in (m.FENCED_OUT, m.LOCK_LOST):
            workflow.logger.warning("grant %s lost: %s", grant.token, why)
            return True
        return False

    async def _acquire_and_execute(self, inp: m.PayoutInput) -> m.RunResult | None:
        """The two-task path's one activity (patch `acquire-and-execute`): the acquire, and
        under its grant the merged holder step, in the worker that got the grant.

        What prevents a double payout: ONE attempt (`_SUBMIT_ONCE`), because the activity may
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
                retry_policy=_SUBMIT_ONCE,
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

    async def _execute(self, inp: m.PayoutInput, grant: m.AcquireResult) -> m.PayoutView:
        """UC-01 steps 3-9 as one holder activity (patch `merged-holder-steps`).

        What prevents a double payout: ONE attempt (`_SUBMIT_ONCE`), because the activity may
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
            _SUBMIT_ONCE,
            summary=EXECUTE_SUMMARY,
        )

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
                        PayoutActivities.submit_to_rail,
                        self._step(inp, grant, "submit"),
                        queue,
                        _SUBMIT_ONCE,
                    )
                    if view.state == PayoutState.CLAIMED.value:
                        # NOT_SUBMITTED (circuit open, admission full, ...): try again later.
                        self._last_error = f"not submitted: {view.detail}"
                        return False
                    continue
                view = await self._on_holder(
                    PayoutActivities.recover_from_attempt,
                    self._step(inp, grant, "recover"),
                    queue,
                    _DB_WRITE_RETRY,
                )
                continue
            if state == PayoutState.RAIL_SUBMITTED.value:
                # Recovery by evidence: the attempt's recorded outcome decides; an attempt with
                # no outcome becomes RAIL_AMBIGUOUS and is never resubmitted (UC-04, FR-23).
                view = await self._on_holder(
                    PayoutActivities.recover_from_attempt,
                    self._step(inp, grant, "recover"),
                    queue,
                    _DB_WRITE_RETRY,
                )
                continue
            if state == PayoutState.RAIL_ACKED.value:
                view = await self._on_holder(
                    PayoutActivities.post_to_ledger,
                    self._step(inp, grant, "post"),
                    queue,
                    _DB_WRITE_RETRY,
                )
                continue
            if state == PayoutState.RAIL_AMBIGUOUS.value:
                resolved = await self._ambiguous_step(inp, grant)
                if resolved is None:
                    return True  # release the lock; resolve by lookups outside the section
                view = resolved
                continue
            if state == PayoutState.PENDING.value:
                # The claim did not happen (e.g. another holder's work in flight): retry later.
                return False
            # A state this code does not know (a newer deployment's?): never a reason to fail
            # the workflow. Report it, back off and read the state afresh under a new grant.
            self._last_error = f"unexpected payout state {state}"
            workflow.logger.error("unexpected payout state %s", state)
            return False

    async def _ambiguous_step(
        self, inp: m.PayoutInput, grant: m.AcquireResult
    ) -> m.PayoutView | None:
        """RAIL_AMBIGUOUS under a grant (patch `operator-commands`). Evidence outranks any
        command: a rail outcome already known is applied, and a pending abandon is refused
        naming it; otherwise a pending abandon is carried out, unless the abandon activity's own
        last lookup finds the rail's evidence first. None: nothing to do under this grant."""
        if not self._commands_on():
            return await self._legacy_ambiguous_step(inp, grant)
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

    async def _legacy_ambiguous_step(
        self, inp: m.PayoutInput, grant: m.AcquireResult
    ) -> m.PayoutView | None:
        """Before patch `operator-commands`: a pending abandon first (as those histories ran),
        then a known resolution."""
        if self._abandon is not None:
            return await self._carry_out_abandon(inp, grant, self._abandon)
        if self._resolution:
            return await self._apply_resolution(inp, grant)
        return None

    async def _apply_resolution(self, inp: m.PayoutInput, grant: m.AcquireResult) -> m.PayoutView:
        view = await self._on_holder(
            PayoutActivities.resolve_ambiguous,
            self._step(inp, grant, "resolve", resolution=self._resolution),
            grant.worker_queue,
            _DB_WRITE_RETRY,
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
                _DB_WRITE_RETRY,
            )
        except ActivityError as err:
            if not _is_type(err, m.ASSERTION_REFUSED):
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

    async def _carry_out_abandon(
        self, inp: m.PayoutInput, grant: m.AcquireResult, cmd: m.OperatorCommand
    ) -> m.PayoutView | None:
        """The abandon under this grant; None when the payment store refused the command's
        operator assertion: the rejection is recorded (audit row + `operator.signal_rejected`),
        the command dropped, and nothing changed."""
        try:
            return await self._on_holder(
                PayoutActivities.abandon_payout,
                self._step(
                    inp,
                    grant,
                    "abandon",
                    operator=cmd.operator,
                    reason=cmd.reason,
                    assertion=cmd.assertion,
                ),
                grant.worker_queue,
                _DB_WRITE_RETRY,
            )
        except ActivityError as err:
            # Only new code can meet this refusal; the patch marks the commands it adds.
            if not _is_type(err, m.ASSERTION_REFUSED) or not workflow.patched(
                PATCH_VERIFIED_ABANDON
            ):
                raise
            self._abandon = None
            await self._reject("abandon", cmd, f"abandon refused: {cause(err)}")
            return None

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
        return self._abandon is not None or self._desk.pending_abandon() is not None

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
                retry_policy=_unlimited_retry(inp),
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
                retry_policy=_unlimited_retry(inp),
            )
        except ActivityError as err:
            self._last_error = f"escalation not recorded: {cause(err)}"


def _is_type(err: ActivityError, error_type: str) -> bool:
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == error_type
