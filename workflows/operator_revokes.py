"""The revoke coroutine of one PayoutWorkflow run (`Revokes`): the revokes the operator desk
accepted (`workflows.operator_desk`), carried out one at a time by `carry_out_revoke`, for as
long as the run lasts.

Owns: when a revoke is attempted, retried after an outage, and stopped (before continue-as-new,
once the payout is terminal). Must never: have more than one revoke attempt in flight, carry a
revoke out twice across continue-as-new, or revoke after the payout is terminal (the account's
lock may belong to its next payout by then). Deterministic workflow code: imported by
`workflows.payout_state` inside the sandbox; no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from workflows.operator_desk import AUDIT_TIMEOUT, OperatorDesk, cause

__all__ = ["Revokes"]


class Revokes:
    """The accepted revokes of one run's operator desk, carried out one by one."""

    def __init__(self, inp: m.PayoutInput, desk: OperatorDesk) -> None:
        self._input = inp
        self._desk = desk
        self._stopping = False

    async def run(self) -> None:
        """Carry out accepted revokes one by one, for as long as the run lasts.

        Each attempt is one activity attempt of at most `AUDIT_TIMEOUT`, retried here after a
        capped backoff rather than by Temporal: so no revoke is ever in flight for longer than
        one attempt, and continue-as-new waits for that attempt instead of cancelling it. A
        revoke that completes in the same activation in which the run continues as new is then
        recorded as carried out, not carried to the next run and done twice (the SDK erases the
        result of an activity cancelled in the activation that completes it).
        """
        desk = self._desk
        failures = 0
        while True:
            await workflow.wait_condition(lambda: self._stopping or desk.next_revoke() is not None)
            record = desk.next_revoke()
            if self._stopping or record is None:
                return
            verdict = await self._revoke_once(record)
            if verdict is None:  # an outage: try again after a backoff, unless stopping
                failures += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await workflow.wait_condition(
                        lambda: self._stopping, timeout=self._revoke_backoff(failures)
                    )
                continue
            failures = 0
            if verdict.outcome == "carried_out":
                desk.carried_out(record, verdict.why)
            else:
                desk.refused(record, verdict.why or "the revoke was refused")

    async def stop(self, revoker: asyncio.Task[None], *, cancel_in_flight: bool) -> None:
        """Stop the revoke coroutine `revoker` (running `run`).

        Before continuing as new (`cancel_in_flight=False`) it lets the attempt in flight end
        (at most one attempt's timeout), so that the revoke is neither lost nor carried out
        again by the next run. Once the payout is terminal it cancels it instead: the account's
        lock may belong to its next payout by now, so the revoke must not go through later
        (`carry_out_revoke` also refuses to revoke for a terminal payout, which closes the
        window of an attempt already running)."""
        self._stopping = True
        if cancel_in_flight:
            revoker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await revoker
            return
        await revoker

    async def drop_pending(self, state: str) -> None:
        """The payout is terminal: a revoke not carried out by now is refused, because the
        account's lock may already belong to its next payout."""
        for record in self._desk.pending("revoke"):
            await self._desk.refuse(
                record, f"payout reached {state} before the revoke was carried out", "terminal"
            )

    async def _revoke_once(self, record: m.CommandRecord) -> m.CommandVerdict | None:
        """One attempt; None when it failed for an outage (the lock service or the database
        unreachable, a timeout): the command stays pending. A refusal is a verdict."""
        try:
            verdict: m.CommandVerdict = await workflow.execute_activity_method(
                PayoutActivities.carry_out_revoke,
                m.RevokeRequest(
                    account_id=self._input.account_id,
                    operator=record.operator,
                    reason=record.reason,
                    payout_id=self._input.payout_id,
                    assertion=record.assertion,
                    command_id=record.command_id,
                ),
                start_to_close_timeout=AUDIT_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=1),  # retried by `run`
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise asyncio.CancelledError from err  # the payout ended: see `stop`
            if not (isinstance(err.cause, ApplicationError) and err.cause.non_retryable):
                return None
            why = f"revoke could not be carried out: {cause(err)}"
            await self._desk.refuse(record, why, code="failed")
            return m.CommandVerdict(
                command_id=record.command_id, accepted=True, outcome="refused", why=why
            )
        return verdict

    def _revoke_backoff(self, failures: int) -> timedelta:
        cap = max(0.1, self._input.read_retry_max_interval_s)
        base = min(cap, 0.5 * 2 ** min(failures, 16))
        return timedelta(seconds=base * workflow.random().uniform(0.5, 1.0))
