"""The critical-section steps of UC-01 and UC-04, run under the account's grant on the holder's
own queue: submit, recover from an attempt, post, resolve, abandon (the claim is the start of
`execute_payout`, `execute.py`).

`CriticalSteps` writes only through its `HolderWriter`; `PayoutActivities` registers its steps
as activities, each inside `HeldGrants.holding` (in use, heartbeating).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.fenced import HolderWriter
from activities.payout.grants import HeldGrants
from activities.payout.lookups import rail_evidence
from activities.payout.support import (
    GrantArg,
    S,
    fenced_error,
    latest_live_attempt,
    log,
    lost_error,
    payout_view,
)
from ledger import AlreadyAdvanced, Payout, PayoutStore
from ledger.errors import InvalidOperatorAssertion
from railproxy.client import RailProxyClient, SubmitResult
from railproxy.models import (
    AttemptRecord,
    GrantIn,
    HandoffCertainty,
    Outcome,
    SubmitContext,
    SubmitRequest,
)

__all__ = ["CriticalSteps"]

_MAX_ID = 128


class CriticalSteps:
    """The separate holder steps; the merged `execute_payout` (`execute.py`) reuses `submit`."""

    def __init__(
        self,
        *,
        store: PayoutStore,
        writer: HolderWriter,
        grants: HeldGrants,
        proxy: RailProxyClient,
        worker_id: str,
        now: Callable[[], datetime],
        pause_before_submit: bool = False,
    ) -> None:
        self._store = store
        self._writer = writer
        self._grants = grants
        self._proxy = proxy
        self._worker_id = worker_id
        self._now = now
        # UC-03 experiment only: freeze this process (a real SIGSTOP, like a stop-the-world GC)
        # once, between the still_held() check and the rail call: the check-then-act gap.
        self._pause_before_submit = pause_before_submit
        if pause_before_submit:
            log.warning(
                "experiment.pause_armed",
                worker_id=worker_id,
                detail="this worker will SIGSTOP itself before its first submit",
            )

    async def latest_attempt(self, payout_id: str) -> AttemptRecord | None:
        """The proxy's record of the payout's attempt that counts (FR-24 evidence), if any."""
        return latest_live_attempt(await self._proxy.get_attempts(payout_id))

    async def submit_to_rail(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 steps 5-7. Scheduled with maximum_attempts=1 and never retried here either.

        What stops a second payment: the proxy refuses a token below the account's highest
        (FR-17) and any second attempt for this payout whatever the token (FR-18), and it records
        the attempt before forwarding (FR-19), so recovery can always see it.
        """
        # `HeldGrants.holding` heartbeats from the start: if this process stalls anywhere in the
        # step (a GC pause, a SIGSTOP), the heartbeat timeout hands the payout to recovery within
        # seconds.
        payout = await self._writer.current(req.payout_id)
        if payout.state != S.CLAIMED:
            return payout_view(payout, detail="not_claimed")
        return await self.submit(req, payout)

    async def submit(
        self, req: m.StepRequest, payout: Payout, *, post_when_acked: bool = False
    ) -> m.PayoutView:
        """The one submission of a CLAIMED payout, for `submit_to_rail` and `execute_payout`:
        both are scheduled with maximum_attempts=1 and call this at most once per attempt.
        The proxy refuses a second attempt for the payout (FR-18) and a token below the
        account's highest (FR-17), and records the attempt before forwarding (FR-19).

        `post_when_acked` (`execute_payout`): an ack is recorded and posted in one transaction
        (`PayoutStore.ack_and_post`), and the view comes back POSTED."""
        grant = await self._grants.signed_grant(req)
        deadline = (
            datetime.fromisoformat(req.context.deadline_at)
            if req.context.deadline_at
            else self._now() + timedelta(seconds=30)
        )
        submit = SubmitRequest(
            payout_id=payout.payout_id,
            account_id=payout.account_id,
            amount=payout.amount,
            client_reference=payout.client_reference,
            token=req.token,
            # The proxy verifies the lock service's signature before anything else (INV-07).
            grant=None if grant is None else GrantIn(**grant.to_json()),
            context=SubmitContext(
                correlation_id=req.context.correlation_id[:_MAX_ID],
                causation_id=(req.context.causation_id or payout.payout_id)[:_MAX_ID],
                deadline_at=deadline,
            ),
        )
        if self._pause_before_submit:
            self._pause_before_submit = False
            log.warning(
                "experiment.pausing",
                worker_id=self._worker_id,
                token=req.token,
                payout_id=payout.payout_id,
                # The chaos harness thaws this process before the request's deadline passes.
                deadline_at=deadline.isoformat(),
            )
            os.kill(os.getpid(), signal.SIGSTOP)  # resumes here on SIGCONT, unaware of the gap
            log.warning(
                "experiment.resumed",
                worker_id=self._worker_id,
                token=req.token,
                still_held=self._grants.still_held(req),
            )
        # Once sent, the exchange is not cut short by an activity cancellation: cancelling an
        # HTTP call cannot un-send money, it only loses the answer. The proxy records the outcome
        # either way; recovery reads it from there.
        exchange = asyncio.create_task(self._submit_logged(submit, req.context.correlation_id))
        result = await asyncio.shield(exchange)
        return await self._apply_submit_result(req, payout, result, post_when_acked)

    async def _submit_logged(self, submit: SubmitRequest, correlation_id: str) -> SubmitResult:
        result = await self._proxy.submit(submit)
        log.info(
            "rail.submit",
            payout_id=submit.payout_id,
            account_id=submit.account_id,
            token=submit.token,
            handoff_certainty=result.handoff_certainty.value,
            outcome=result.outcome.value if result.outcome else None,
            code=result.code,
            correlation_id=correlation_id,
        )
        return result

    async def _apply_submit_result(
        self, req: m.StepRequest, payout: Payout, result: SubmitResult, post_when_acked: bool
    ) -> m.PayoutView:
        ctx = self._writer.ctx(req.context)
        if result.code == "INVALID_GRANT":
            # Nothing was forwarded or recorded; our grant cannot be used there: re-acquire.
            raise lost_error(req, "rail proxy refused the grant")
        if result.code == "STALE_TOKEN":
            # The second enforcement point fenced us out: a newer grant exists.
            raise fenced_error(
                f"rail proxy: token {result.presented_token} below {result.highest_token}"
            )
        if result.handoff_certainty == HandoffCertainty.NOT_SUBMITTED or result.outcome is None:
            # Nothing left our control (or we cannot tell yet: PROXY_NO_ANSWER). The payout stays
            # CLAIMED; the next round reads the proxy's attempt record before doing anything.
            return payout_view(
                payout,
                detail=result.code or "not_submitted",
                handoff_certainty=result.handoff_certainty.value,
            )
        if result.outcome == Outcome.ACKED and post_when_acked:
            # RAIL_SUBMITTED, RAIL_ACKED and the posting follow each other here: one transaction,
            # one commit (the same three audit rows and events and the ledger group; issue 29).
            # The rail acknowledged this very attempt, so the debit records money that moved;
            # it is made at most once (`WorkerSteps.ack_and_post`).
            payout = await self._writer.write(
                req,
                lambda g: self._store.ack_and_post(payout.payout_id, req.token, ctx, grant=g),
            )
        elif result.outcome == Outcome.ACKED:
            # RAIL_SUBMITTED and RAIL_ACKED follow each other here: one transaction, one commit
            # (the same two audit rows and events; issue 16).
            payout = await self._writer.write(
                req,
                lambda g: self._store.mark_submitted_and_acked(
                    payout.payout_id, req.token, ctx, grant=g
                ),
            )
        else:
            payout = await self._writer.write(
                req,
                lambda g: self._store.mark_submitted(payout.payout_id, req.token, ctx, grant=g),
            )
        payout = await self._record_outcome(req, payout, result.outcome)
        attempt = m.AttemptView(
            attempt_id=str(result.attempt_id), outcome=result.outcome.value, token=req.token
        )
        return payout_view(
            payout, handoff_certainty=result.handoff_certainty.value, attempt=attempt
        )

    async def _record_outcome(
        self, req: m.StepRequest, payout: Payout, outcome: Outcome | None
    ) -> Payout:
        ctx = self._writer.ctx(req.context)
        if payout.state != S.RAIL_SUBMITTED:
            return payout
        if outcome == Outcome.ACKED:
            return await self._writer.write(
                req, lambda g: self._store.mark_acked(payout.payout_id, req.token, ctx, grant=g)
            )
        if outcome == Outcome.DECLINED:
            return await self._writer.write(
                req,
                lambda g: self._store.mark_declined(
                    payout.payout_id, req.token, ctx, reason="declined_by_rail", grant=g
                ),
            )
        # UNKNOWN, or no outcome recorded: money may have moved. Never resubmitted (FR-23).
        return await self._writer.write(
            req,
            lambda g: self._store.mark_ambiguous(
                payout.payout_id,
                req.token,
                ctx,
                reason="no_outcome_recorded" if outcome is None else "outcome_unknown",
                grant=g,
            ),
        )

    async def recover_from_attempt(self, req: m.StepRequest) -> m.PayoutView:
        """UC-04: a payout left CLAIMED or RAIL_SUBMITTED by a holder that died or was fenced.

        The proxy's attempt record decides: it was recorded before forwarding, so its absence
        proves nothing was sent, and an attempt with no outcome is ambiguous, never resubmitted.
        """
        payout = await self._writer.current(req.payout_id)
        attempt = await self.latest_attempt(req.payout_id)
        if payout.state == S.CLAIMED:
            if attempt is None:
                return payout_view(payout)  # nothing was handed off: the workflow may submit
            payout = await self._writer.write(
                req,
                lambda g: self._store.mark_submitted(
                    payout.payout_id, req.token, self._writer.ctx(req.context), grant=g
                ),
            )
        if payout.state == S.RAIL_SUBMITTED:
            payout = await self._record_outcome(req, payout, attempt.outcome if attempt else None)
        return payout_view(payout, attempt)

    async def post_to_ledger(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 step 8: ledger rows, balance and POSTED in one fenced transaction."""
        payout = await self._writer.write(
            req,
            lambda g: self._store.post(
                req.payout_id, req.token, self._writer.ctx(req.context), grant=g
            ),
        )
        return payout_view(payout)

    async def resolve_ambiguous(self, req: m.StepRequest) -> m.PayoutView:
        ctx = self._writer.ctx(req.context)
        if req.resolution == "settled":

            def write(g: GrantArg) -> Awaitable[Payout | AlreadyAdvanced]:
                return self._store.resolve_settled(req.payout_id, req.token, ctx, grant=g)
        elif req.resolution == "absent":

            def write(g: GrantArg) -> Awaitable[Payout | AlreadyAdvanced]:
                return self._store.resolve_absent(req.payout_id, req.token, ctx, grant=g)
        else:
            raise ApplicationError(f"unknown resolution {req.resolution!r}", non_retryable=True)
        return payout_view(await self._writer.write(req, write))

    async def abandon_payout(self, req: m.StepRequest) -> m.PayoutView:
        """Break-glass RAIL_AMBIGUOUS -> ABANDONED, with the operator as the audited actor.

        `command_id`: the command the payment store accepted (assertion verified, nonce
        recorded), carried out under that acceptance. Evidence outranks the command: one last
        lookup of the rail first, and if it says settled, declined or (proven) absent, nothing is
        abandoned and the view carries the evidence for the workflow to apply. Only a rail that
        cannot tell (pending, unavailable) leaves the operator's decision standing. A command
        the store does not know as accepted and open changes nothing and is final
        (non-retryable `OperatorAssertionRefused`): the workflow records the refusal."""
        if not req.command_id:
            raise ApplicationError(
                "abandon_payout needs the command_id of an accepted abandon command",
                type=m.ASSERTION_REFUSED,
                non_retryable=True,
            )
        ctx = self._writer.ctx(req.context)  # "via" this worker; the store audits the operator
        current = await self._writer.current(req.payout_id)
        if current.state == S.RAIL_AMBIGUOUS and current.client_reference:
            found = await rail_evidence(self._proxy, current.client_reference, req.payout_id)
            if found.status in ("settled", "declined", "absent"):
                log.warning(
                    "operator.abandon_outranked",
                    payout_id=req.payout_id,
                    command_id=req.command_id,
                    evidence=found.status,
                )
                return payout_view(current, evidence=found.status)
        try:
            return payout_view(
                await self._writer.write(
                    req,
                    lambda g: self._store.abandon(
                        req.payout_id,
                        req.token,
                        ctx,
                        operator=req.operator,
                        reason=req.reason,
                        grant=g,
                        command_id=req.command_id,
                    ),
                )
            )
        except InvalidOperatorAssertion as exc:
            raise ApplicationError(
                f"operator assertion refused ({exc.reason}): {exc}",
                type=m.ASSERTION_REFUSED,
                non_retryable=True,
            ) from exc
