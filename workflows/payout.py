"""PayoutWorkflow: one payout, executed exactly once, following UC-01 step by step.

Each UC-01 step stays identifiable in the Temporal UI. The happy path takes two workflow tasks:
one activity on the shared queue, `acquire_and_execute`, in which the worker granted the
account's lock re-reads and claims, submits, posts and releases (`inp.two_task=False`, the A/B
switch: the acquire, then the merged holder step `execute_payout` on that worker's queue). A
payout found in flight goes on by the named state-based steps (recover, submit, post, release).
Recovery (UC-04, FR-24) is decided by the payout's state and the rail proxy's attempt record,
never by elapsed time. RAIL_AMBIGUOUS is resolved only by lookups by client reference or by an
operator (UC-05).

Owns: the run loop (acquire, critical section, backoff, lookups, continue-as-new), the operator
signals and Updates, and the workflow's history size. Must never: retry the submit, fail for an
infrastructure reason (an outage of the lock service, the database, the rail or every worker
only delays a payout, docs/architecture.md#workflow-shape), or let an operator command that
cannot be carried out escape a signal handler.

Its parts, each deterministic workflow code: `workflows.payout_state` (what the run knows and
shows: status, carried state, details, search attributes), `workflows.payout_section` (the
grant and every command under it), `workflows.payout_lookups` (UC-05 lookups and escalation),
`workflows.payout_steps` (retry policies, backoff, the recovery decision),
`workflows.operator_desk` (operator commands) and `workflows.operator_revokes` (carrying out
accepted revokes). A change of the commands any of them issues follows docs/workflow.md,
"Changing the workflow" (`workflow.patched`, a replay history per new branch). See
docs/workflow.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from ledger.states import TERMINAL_STATES, PayoutState
    from workflows.payout_lookups import Lookups
    from workflows.payout_section import CriticalSection
    from workflows.payout_state import PayoutRun
    from workflows.payout_steps import backoff

__all__ = ["PayoutWorkflow"]


@workflow.defn(name="PayoutWorkflow")
class PayoutWorkflow:
    @workflow.init
    def __init__(self, inp: m.PayoutInput) -> None:
        # State is restored here, not in run(): signals delivered in a run's first activation
        # are handled before run() starts, and must see the carried state (escalation, ...).
        self._run = PayoutRun(inp)
        self._desk = self._run.desk
        self._revokes = self._run.revokes
        self._section = CriticalSection(self._run)
        self._lookups = Lookups(self._run)

    # ------------------------------------------------------------------ entry point

    @workflow.run
    async def run(self, inp: m.PayoutInput) -> m.PayoutStatus:
        # A payout workflow is never cancelled (UI "Request Cancellation", `temporal workflow
        # cancel`): the payout runs in a task of its own, shielded, so that the cancellation
        # reaches only this primary task, which records and audits it and goes on waiting. No
        # activity of the payout is cancelled by it, so no submit is cut off mid-flight.
        payout = asyncio.create_task(self._pay(inp))
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

    async def _pay(self, inp: m.PayoutInput) -> m.PayoutStatus:
        run, section = self._run, self._section
        revoker = asyncio.create_task(self._revokes.run())
        run.publish()
        backoff_round = 0
        while run.state not in TERMINAL_STATES:
            if self._continue_as_new_due():
                # A safe point: no critical section is open and no grant is held.
                await self._continue_as_new(revoker)
            if run.state == PayoutState.RAIL_AMBIGUOUS.value and not (
                self._lookups.resolution_known()
            ):
                await self._lookups.resolve(self._continue_as_new_due)
                continue
            # `inp.two_task`: the A/B switch of the starter (issue 29), not a patch.
            done = await section.acquire_and_execute() if inp.two_task else None
            if inp.two_task:
                grant = done.grant if done is not None and done.grant.acquired else None
            else:
                grant = await section.acquire()
            if grant is None:
                # Fail closed (UC-08, FR-27): no grant, no execution. The payout stays as it is
                # and we try again after a jittered backoff: no thundering herd. Contention (the
                # account's other payout holds the lock) is normal: the acquire already waited
                # its budget, so retry soon; an unavailable lock service backs off exponentially.
                if section.contended:
                    await workflow.sleep(
                        backoff(inp, 0), summary="the account's lock is held: try again"
                    )
                    continue
                backoff_round += 1
            elif await section.run(grant, done):
                backoff_round = 0
                continue
            else:
                backoff_round += 1
            await workflow.sleep(
                backoff(inp, backoff_round),
                summary=f"backoff {backoff_round}: {run.last_error[:120]}",
            )
        await self._end_pending_commands(revoker)
        await section.background_releases_done()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._desk.settle_audits()
        return run.status()

    # ------------------------------------------------------------------ queries and signals

    @workflow.query
    def status(self) -> m.PayoutStatus:
        return self._run.status()

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

    async def _end_pending_commands(self, revoker: asyncio.Task[None]) -> None:
        """The payout is terminal. A revoke not carried out by now is refused, not carried out,
        because the account's lock may already belong to its next payout. An abandon still
        pending: ABANDONED means it was carried out (its result was lost with the holder; the
        store ended the command in the same transaction as the transition); any other state
        came first."""
        state = self._run.state
        await self._revokes.stop(revoker, cancel_in_flight=True)
        await self._revokes.drop_pending(state)
        pending = self._desk.pending_abandon()
        if pending is None:
            return
        if state == PayoutState.ABANDONED.value:
            self._desk.carried_out(pending, "ABANDONED")
        else:
            why = f"payout reached {state} before the abandon was carried out"
            await self._desk.refuse(pending, why, code="terminal")

    # ------------------------------------------------------------------ continue-as-new

    def _continue_as_new_due(self) -> bool:
        return (
            self._run.lookups >= max(1, self._run.input.max_lookups_per_run)
            or workflow.info().is_continue_as_new_suggested()
        )

    async def _continue_as_new(self, revoker: asyncio.Task[None]) -> None:
        """Hand the payout to a fresh run with an empty history, carrying what only the workflow
        knows. Called only between critical sections, so no grant is held across the gap."""
        # Never cancelled mid-revoke (issue 24, item 7): the one in flight ends first, so it is
        # neither lost nor carried out again by the next run.
        await self._revokes.stop(revoker, cancel_in_flight=False)
        await self._section.background_releases_done()
        await self._desk.settle_audits()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.logger.info("continuing as new after %s lookups", self._run.lookups)
        carried = self._run.carry()
        workflow.continue_as_new(dataclasses.replace(self._run.input, carried=carried))
