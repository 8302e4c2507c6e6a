"""ReconcileWorkflow: one reconciliation run over a closed window, started by a Temporal Schedule
(`reconcile-hourly`, see `workflows.reconcile_schedule`).

It computes the window from the schedule's action time (the `TemporalScheduledStartTime` search
attribute, so a delayed or re-run action still reconciles the window it was meant for), falling
back to workflow.now() for a manual start, runs the read-only `reconcile` activity and returns
its report. It never repairs anything. It also re-drives stranded payouts
(`redrive_stranded_payouts`: a new workflow for a non-terminal payout whose workflow a person
terminated), which moves no money itself.
"""

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from activities.reconcile import ReconcileActivities
    from activities.reconcile_models import ReconcileInput, ReconcileReport, ReconcileRequest
    from activities.redrive import RedriveActivities

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")

# Reading is safe to retry: the activity runs read-only queries only. No attempt limit: an outage
# of the database or the rail's log only delays the window's reconciliation; a failed run would
# leave its window unreconciled for good (docs/architecture.md#workflow-shape). A bad window still
# fails at once.
_READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=0,
    non_retryable_error_types=["InvalidWindow", "WindowNotClosed"],
)


@workflow.defn(name="ReconcileWorkflow")
class ReconcileWorkflow:
    @workflow.run
    async def run(self, inp: ReconcileInput) -> ReconcileReport:
        start, end = self.window(inp)
        report = await workflow.execute_activity_method(
            ReconcileActivities.reconcile,
            ReconcileRequest(window_start=start.isoformat(), window_end=end.isoformat()),
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=_READ_RETRY,
        )
        if inp.redrive_limit > 0:
            # Payouts nothing drives any more (their workflow terminated, or reset away) get a
            # new workflow, which goes on by state and evidence: never a second submit.
            redrive = await workflow.execute_activity_method(
                RedriveActivities.redrive_stranded_payouts,
                inp.redrive_limit,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=_READ_RETRY,
            )
            report.redriven = redrive.redriven
        return report

    @staticmethod
    def window(inp: ReconcileInput) -> tuple[datetime, datetime]:
        if inp.window_end:
            end = datetime.fromisoformat(inp.window_end)
        else:
            action_time = workflow.info().typed_search_attributes.get(SCHEDULED_START)
            end = (action_time or workflow.now()) - timedelta(seconds=inp.settle_lag_s)
        return end - timedelta(seconds=inp.window_s), end
