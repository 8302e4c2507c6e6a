"""What one run of PayoutWorkflow knows of its payout (`PayoutRun`), and every way it tells it:
the status query, the state carried to the next run, the Temporal UI's current details, the
search attributes, and the context of each step it schedules.

Owns: the run's knowledge (state, token, attempt, escalation, resolution and its evidence,
lookups, rejections, the last error), its operator desk and its revoke coroutine. Must never:
schedule an activity or a timer (the workflow and its section, lookup, desk and revoke objects
do), or read a clock or randomness outside the workflow API. Imported by `workflows.payout`
inside the sandbox.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from ledger.states import PayoutState
    from workflows.details import Snapshot, current_details
    from workflows.operator_desk import Facts, OperatorDesk
    from workflows.operator_revokes import Revokes
    from workflows.payout_steps import (
        CARRIED_REJECTIONS,
        changed_search_attributes,
        unlimited_retry,
    )

__all__ = ["PayoutRun"]


class PayoutRun:
    """One run's knowledge of its payout; restored from the previous run's `CarriedState`."""

    def __init__(self, inp: m.PayoutInput) -> None:
        self.input = inp
        self.state = PayoutState.PENDING.value
        self.token = 0
        self.attempt: m.AttemptView | None = None
        self.client_reference = ""
        self.escalated = False
        self.ambiguous_since: datetime | None = None
        self.rejections: list[m.SignalRejection] = []
        self.last_error = ""
        self.lookups = 0  # in this run; bounds the history (continue-as-new)
        self.lookups_before = 0  # lookups of this payout in the runs before this one
        self.last_lookup: m.LookupRecord | None = None
        self.runs = 1
        self.resolution = ""  # "settled" or "absent", from the rail's lookup evidence
        self.evidence = ""  # what the rail said that decided `resolution`
        self.amount = inp.amount  # from the starter; then from the payment database's view
        self.failure_reason: str | None = None
        self.step_name = ""  # the step it is at (the Temporal UI's current details)
        self._steps = 0  # steps scheduled by this run: part of each causation id
        carried = inp.carried
        if carried is not None:
            self._restore(carried)
        self.desk = OperatorDesk(
            inp,
            self.facts,
            unlimited_retry(inp),
            carried.commands if carried is not None else [],
            self.rejections,  # shared: the desk's refusals are the status' rejections too
        )
        if carried is not None:
            self.desk.cancel_requests = carried.cancel_requests
        self.revokes = Revokes(inp, self.desk)

    def _restore(self, c: m.CarriedState) -> None:
        self.state = c.state
        self.token = c.token
        self.attempt = c.attempt
        self.client_reference = c.client_reference
        self.escalated = c.escalated
        if c.ambiguous_since:
            self.ambiguous_since = datetime.fromisoformat(c.ambiguous_since)
        self.resolution = c.resolution
        self.rejections = list(c.rejected_signals)
        self.last_error = c.last_error
        self.runs = c.runs + 1
        self.evidence = c.evidence
        self.lookups_before = c.lookups
        self.last_lookup = c.last_lookup

    # ------------------------------------------------------------------ what it tells

    def facts(self) -> Facts:
        """What the operator desk judges a command by."""
        return Facts(
            state=self.state,
            escalated=self.escalated,
            resolution=self.resolution,
            evidence=self.evidence,
        )

    def all_lookups(self) -> int:
        return self.lookups_before + self.lookups

    def status(self) -> m.PayoutStatus:
        return m.PayoutStatus(
            payout_id=self.input.payout_id,
            state=self.state,
            token=self.token,
            attempt=self.attempt,
            escalated=self.escalated,
            rejected_signals=list(self.rejections),
            last_error=self.last_error,
            pending_revokes=self.desk.pending_revokes(),
            runs=self.runs,
            account_id=self.input.account_id,
            resolution=self.resolution,
            evidence=self.evidence,
            lookups=self.all_lookups(),
            last_lookup=self.last_lookup,
            commands=self.desk.records(),
            cancel_requests=self.desk.cancel_requests,
        )

    def carry(self) -> m.CarriedState:
        """What the next run needs that the payment database does not know."""
        return m.CarriedState(
            state=self.state,
            token=self.token,
            attempt=self.attempt,
            client_reference=self.client_reference,
            escalated=self.escalated,
            ambiguous_since=self.ambiguous_since.isoformat() if self.ambiguous_since else None,
            resolution=self.resolution,
            # Every rejection is audited in the payment database; the carried list only feeds the
            # status query, so a flood of bad signals cannot grow the next run's input unbounded.
            rejected_signals=self.rejections[-CARRIED_REJECTIONS:],
            last_error=self.last_error,
            runs=self.runs,
            commands=self.desk.carry(),
            evidence=self.evidence,
            lookups=self.all_lookups(),
            last_lookup=self.last_lookup,
            cancel_requests=self.desk.cancel_requests,
        )

    def show(self) -> None:
        """Refresh what the Temporal UI shows of the payout (workflows.details). Not a command:
        replay is unaffected, and it costs no history event."""
        workflow.set_current_details(
            current_details(
                Snapshot(
                    payout_id=self.input.payout_id,
                    account_id=self.input.account_id,
                    amount=self.amount,
                    state=self.state,
                    step=self.step_name,
                    token=self.token,
                    escalated=self.escalated,
                    resolution=self.resolution,
                    evidence=self.evidence,
                    failure_reason=self.failure_reason,
                    lookups=self.all_lookups(),
                    last_lookup=self.last_lookup,
                    commands=self.desk.records(),
                    cancel_requests=self.desk.cancel_requests,
                    last_error=self.last_error,
                )
            )
        )

    def publish(self) -> None:
        """Upsert state, account and escalation as search attributes when they differ from the
        workflow's own, so that operators find payouts by state in the Temporal UI and CLI
        (workflows.search_attributes); the starter sets all three, so the middle of a payout
        upserts nothing (one visibility write less per workflow task, issue 16). A command."""
        self.show()
        changed = changed_search_attributes(
            workflow.info().typed_search_attributes,
            self.state,
            self.input.account_id,
            self.escalated,
        )
        if changed:
            workflow.upsert_search_attributes([p.key.value_set(p.value) for p in changed])

    # ------------------------------------------------------------------ what it learns

    def observe(self, view: m.PayoutView) -> None:
        """An activity's view of the payout, from the payment database."""
        self.state = view.state
        self.amount = view.amount or self.amount
        self.failure_reason = view.failure_reason or self.failure_reason
        self.client_reference = view.client_reference or self.client_reference
        if view.attempt is not None:
            self.attempt = view.attempt
        self.publish()

    def learn(self, status: str, source: str) -> None:
        """A rail outcome, from a lookup: settled -> RAIL_ACKED; declined or proven absent ->
        FAILED. Applied under the next grant; from now on an abandon is refused naming it."""
        self.resolution = "settled" if status == "settled" else "absent"
        self.evidence = f"{source} at {workflow.now().isoformat()}: {status}"

    # ------------------------------------------------------------------ what each step carries

    def context(self, step: str, deadline_s: float | None = None) -> m.WorkContext:
        """The correlation and causation of the step about to be scheduled (and shown)."""
        self._steps += 1
        self.step_name = step
        self.show()
        info = workflow.info()
        deadline = None
        if deadline_s is not None:
            deadline = (workflow.now() + timedelta(seconds=deadline_s)).isoformat()
        return m.WorkContext(
            correlation_id=self.input.correlation_id or self.input.payout_id,
            causation_id=f"{info.workflow_id}:{info.run_id}:{step}:{self._steps}",
            deadline_at=deadline,
        )

    def step(self, grant: m.AcquireResult, name: str, **kw: Any) -> m.StepRequest:
        """A critical-section step's request under `grant`."""
        deadline_s = self.input.submit_deadline_s if name in ("submit", "execute") else None
        return m.StepRequest(
            payout_id=self.input.payout_id,
            account_id=self.input.account_id,
            token=grant.token,
            context=self.context(name, deadline_s),
            **kw,
        )
