"""The merged holder step `execute_payout`: UC-01 steps 3-9 in one activity (re-read and
claim, submit, post, release).
"""

from __future__ import annotations

from activities import models as m
from activities.payout.critical import CriticalSteps
from activities.payout.fenced import HolderWriter
from activities.payout.grants import HeldGrants
from activities.payout.support import S, payout_view, progress
from ledger import PayoutStore
from ledger.states import TERMINAL_STATES

__all__ = ["ExecuteStep"]


class ExecuteStep:
    """execute_payout and its finish (release of a terminal payout's grant); the submit is the
    one of `CriticalSteps`, so that there is one submission code path."""

    def __init__(
        self,
        *,
        store: PayoutStore,
        writer: HolderWriter,
        grants: HeldGrants,
        critical: CriticalSteps,
    ) -> None:
        self._store = store
        self._writer = writer
        self._grants = grants
        self._critical = critical

    async def execute_payout(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 steps 3-9 in one holder activity: re-read and claim, submit, post, and the
        release of the grant once the payout is terminal.

        What prevents a double payout: the workflow schedules this activity with
        maximum_attempts=1, so no retry can reach the submit twice; the submit happens only when
        THIS attempt moved the payout PENDING -> CLAIMED (a payout found CLAIMED or later is
        returned to the workflow, whose state-based recovery reads the proxy's attempt record
        as evidence); and the proxy itself refuses a second
        attempt for the payout (FR-18) and any token below the account's highest (FR-17). A
        failure or timeout anywhere after the claim leaves the payout CLAIMED, RAIL_SUBMITTED
        or RAIL_ACKED, and the workflow's next grant recovers from there by evidence, never by
        submitting again on a guess.

        Each step is visible while it runs (the heartbeat details: `{"step", "state"}`) and
        after (the result's `steps`), and the workflow upserts the payout's state.
        """
        steps: list[str] = []
        progress("claim", "claiming")
        # The claim comes first, with no read before it: its fenced UPDATE ... WHERE state =
        # 'PENDING' decides whether THIS attempt claimed (`claimed_here`), and a payout found in
        # any other state is re-read after it. Its transaction also stamps the account's balance
        # fence with our token whatever state the payout is in (INV-01: a thawed older holder is
        # fenced out at once, even when we only recover or find the payout finished). One
        # statement fewer on the happy path than reading first (issue 29), the same decision.
        claimed_here, payout = await self._writer.claim(req)
        steps.append("claim")
        if not claimed_here or payout.state != S.CLAIMED:
            # Found in flight (another holder's work) or FAILED at the claim (insufficient
            # funds): hand the state and its evidence to the workflow (`workflows.payout_steps`).
            attempt = None
            if payout.state in (S.CLAIMED, S.RAIL_SUBMITTED):
                attempt = await self._critical.latest_attempt(req.payout_id)
            return await self._finish(req, payout_view(payout, attempt), steps)
        # Claimed from PENDING by this attempt: no edge leads back to PENDING and a submit needs
        # CLAIMED, so nobody has submitted this payout and the proxy can hold no attempt for it.
        # An attempt read here would find nothing: skipped.
        progress("submit", str(payout.state))
        # An ack comes back POSTED: recorded and posted in the submit's one transaction. Not
        # with the UC-04 experiment's crash armed at RAIL_ACKED: there the ack and the posting
        # stay two commits, so that the worker dies with the payout RAIL_ACKED, the state that
        # recovery's own paths (a recovered ack, a lookup that finds it settled) still leave.
        split = self._writer.crashes_at(str(S.RAIL_ACKED))
        view = await self._critical.submit(req, payout, post_when_acked=not split)
        steps.append("submit")
        if view.state == S.POSTED:
            steps.append("post")
            return await self._finish(req, view, steps)
        if view.state != S.RAIL_ACKED:
            # NOT_SUBMITTED (still CLAIMED: the workflow backs off), FAILED (declined) or
            # RAIL_AMBIGUOUS (resolved by lookups, never resubmitted).
            return await self._finish(req, view, steps)
        progress("post", view.state)
        posted = await self._writer.write(
            req,
            lambda g: self._store.post(
                req.payout_id, req.token, self._writer.ctx(req.context), grant=g
            ),
        )
        steps.append("post")
        done = payout_view(posted, view.attempt, handoff_certainty=view.handoff_certainty)
        return await self._finish(req, done, steps)

    async def _finish(
        self, req: m.StepRequest, view: m.PayoutView, steps: list[str]
    ) -> m.PayoutView:
        """UC-01 step 9 folded into the last step: a terminal payout's grant is released here,
        and the workflow schedules no separate release. Not terminal: the workflow goes on
        under the grant (recovery, backoff, lookups) and releases it itself."""
        if view.state in {str(s) for s in TERMINAL_STATES}:
            progress("release", view.state)
            await self._grants.release(req)
            steps.append("release")
            view.released = True
        view.steps = steps
        return view
