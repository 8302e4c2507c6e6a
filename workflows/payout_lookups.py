"""An ambiguous payout's resolution outside any grant (UC-05, `Lookups`): lookups of the rail by
client reference on durable timers, and the escalation once the resolution SLA has passed.

Owns: when to look the rail up, and when to escalate. Must never: submit (an ambiguous payout is
never submitted again, FR-23), write the payout (the resolution is applied under the next grant,
`workflows.payout_section`), or decide by anything but the rail's evidence and the SLA.
Deterministic workflow code, imported by `workflows.payout` inside the sandbox.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from workflows.operator_desk import cause
    from workflows.payout_state import PayoutRun
    from workflows.payout_steps import unlimited_retry

__all__ = ["Lookups"]


class Lookups:
    """The lookups and the escalation of one run of an ambiguous payout."""

    def __init__(self, run: PayoutRun) -> None:
        self._run = run
        self._input = run.input

    def resolution_known(self) -> bool:
        """A rail outcome to apply, or an accepted abandon to carry out: a grant is needed."""
        return bool(self._run.resolution) or self.abandon_waiting()

    def abandon_waiting(self) -> bool:
        return self._run.desk.pending_abandon() is not None

    async def resolve(self, due: Callable[[], bool]) -> None:
        """Lookups by client reference on durable timers until the rail's evidence settles it,
        or, past the resolution SLA, an operator abandons it. Never resubmits. Returns early when
        the run is due to continue as new (`due`)."""
        run, inp = self._run, self._input
        if run.ambiguous_since is None:
            # The SLA runs from the first lookup of the first run, not of the latest run.
            run.ambiguous_since = workflow.now()
        while not self.resolution_known():
            if due():
                return
            result = await self._lookup()
            if result.status in ("settled", "absent", "declined"):
                run.learn(result.status, f"lookup {run.all_lookups()}")
                return
            waited = (workflow.now() - run.ambiguous_since).total_seconds()
            if not run.escalated and waited >= inp.resolution_sla_s:
                await self._escalate()
            # A durable timer: the next lookup, or an operator's abandon, whichever comes first.
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    self.abandon_waiting,
                    timeout=timedelta(seconds=inp.lookup_interval_s),
                    timeout_summary=f"next lookup of the rail in {inp.lookup_interval_s:g}s "
                    "(sooner for an accepted abandon)",
                )

    async def _lookup(self) -> m.LookupResult:
        run, inp = self._run, self._input
        run.lookups += 1
        try:
            result: m.LookupResult = await workflow.execute_activity_method(
                PayoutActivities.lookup_rail,
                m.LookupRequest(
                    payout_id=inp.payout_id,
                    client_reference=run.client_reference,
                    context=run.context("lookup"),
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=unlimited_retry(inp),
            )
        except ActivityError as err:
            # Only a non-retryable failure gets here. Not evidence of anything: look again later.
            run.last_error = f"lookup failed: {cause(err)}"
            result = m.LookupResult(status="unavailable", detail=run.last_error)
        run.last_lookup = m.LookupRecord(
            number=run.all_lookups(),
            status=result.status,
            detail=result.detail[:500],
            at=workflow.now().isoformat(),
        )
        run.show()
        return result

    async def _escalate(self) -> None:
        run, inp = self._run, self._input
        # Escalated from here on, whether or not the alert's audit row is written: the SLA has
        # passed, so an operator may abandon.
        run.escalated = True
        run.publish()
        try:
            await workflow.execute_activity_method(
                PayoutActivities.escalate_ambiguous,
                m.StepRequest(
                    payout_id=inp.payout_id,
                    account_id=inp.account_id,
                    token=run.token,
                    context=run.context("escalate"),
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=unlimited_retry(inp),
            )
        except ActivityError as err:
            run.last_error = f"escalation not recorded: {cause(err)}"
