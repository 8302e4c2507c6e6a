"""PayoutWorkflow's deterministic helpers: retry policies, the backoff, the recovery decision by
state and evidence, and what it upserts as search attributes.

Owns: the decisions `workflows.payout` takes about one step (which step a payout's state calls
for, how often an activity may be attempted, how long to back off) as plain functions of their
inputs. Must never: perform I/O, read a clock or randomness outside the workflow API, or
schedule anything itself (the workflow does). Imported by `workflows.payout` inside the sandbox.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from enum import Enum
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from ledger.states import TERMINAL_STATES, PayoutState
    from workflows.search_attributes import PAYOUT_ACCOUNT, PAYOUT_ESCALATED, PAYOUT_STATE

__all__ = [
    "CARRIED_REJECTIONS",
    "DB_WRITE_RETRY",
    "EXECUTE_SUMMARY",
    "RUN_SUMMARY",
    "SUBMIT_ONCE",
    "HolderStep",
    "Next",
    "backoff",
    "changed_search_attributes",
    "is_type",
    "next_step",
    "unlimited_retry",
]

#: What an operator sees as the merged activity's summary in the Temporal UI (UC-01 steps 3-9).
EXECUTE_SUMMARY = "UC-01: re-read + claim -> submit (once) -> post -> release"
RUN_SUMMARY = "UC-01: acquire -> re-read + claim -> submit (once) -> post -> release"
#: A critical-section activity of the lock holder's queue, by method reference (`_on_holder`).
HolderStep = Callable[[PayoutActivities, m.StepRequest], Awaitable[m.PayoutView]]
#: The latest rejected signals handed to the next run (all of them are in the audit log).
CARRIED_REJECTIONS = 50

# Database writes before handoff may be retried a few times; fenced rejections never are. A write
# that still fails is not fatal: the critical section ends, the grant is released, and the run
# loop backs off, re-acquires and recovers by the payout's state.
DB_WRITE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=3,
    non_retryable_error_types=[m.FENCED_OUT, m.LOCK_LOST, m.INVALID_TRANSITION, m.UNKNOWN_PAYOUT],
)
# The submit activity is NEVER retried (UC-05, STD01-07): a retry after a possible handoff is a
# second payment, because the rail has no idempotency key. A failed or timed-out submit goes to
# state-based recovery instead, which reads the proxy's attempt record as evidence.
SUBMIT_ONCE = RetryPolicy(maximum_attempts=1)


def unlimited_retry(inp: m.PayoutInput) -> RetryPolicy:
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


def backoff(inp: m.PayoutInput, round_: int) -> timedelta:
    """Exponential in `round_`, capped at `max_backoff_s`, with full jitter from the workflow's
    deterministic random source (replay-safe: call it from workflow code only)."""
    base = min(inp.max_backoff_s, inp.base_backoff_s * (2 ** min(round_, 16)))
    return timedelta(seconds=max(0.05, base * workflow.random().uniform(0.5, 1.0)))


def is_type(err: ActivityError, error_type: str) -> bool:
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == error_type


class Next(Enum):
    """The step a payout's state calls for under a grant (UC-01, UC-04, UC-05)."""

    DONE = "done"  # terminal: nothing more to do
    SUBMIT = "submit"  # CLAIMED, and the proxy's record proves nothing was handed off
    RECOVER = "recover"  # CLAIMED with an attempt, or RAIL_SUBMITTED: the attempt decides
    POST = "post"  # RAIL_ACKED
    AMBIGUOUS = "ambiguous"  # RAIL_AMBIGUOUS: evidence or an operator decides, never a resubmit
    LATER = "later"  # PENDING: the claim did not happen (another holder's work in flight)
    UNKNOWN = "unknown"  # a state this code does not know


def next_step(view: m.PayoutView) -> Next:
    """Recovery by state and evidence, never by elapsed time (FR-24)."""
    if view.state in TERMINAL_STATES:
        return Next.DONE
    if view.state == PayoutState.CLAIMED.value:
        attempt = view.attempt
        if attempt is None or attempt.outcome == "NOT_SUBMITTED":
            # Safe to submit: the proxy's record proves nothing was handed off (FR-24). The
            # proxy itself refuses a second attempt for this payout (FR-18), so even a wrong
            # decision here cannot pay twice.
            return Next.SUBMIT
        return Next.RECOVER
    return _BY_STATE.get(view.state, Next.UNKNOWN)


_BY_STATE = {
    # Recovery by evidence: the attempt's recorded outcome decides; an attempt with no outcome
    # becomes RAIL_AMBIGUOUS and is never resubmitted (UC-04, FR-23).
    PayoutState.RAIL_SUBMITTED.value: Next.RECOVER,
    PayoutState.RAIL_ACKED.value: Next.POST,
    PayoutState.RAIL_AMBIGUOUS.value: Next.AMBIGUOUS,
    PayoutState.PENDING.value: Next.LATER,
}


def changed_search_attributes(
    have: TypedSearchAttributes, state: str, account_id: str, escalated: bool
) -> Sequence[SearchAttributePair[Any]]:
    """State, account and escalation, as far as they differ from what the workflow carries
    already (set at its start by the starter, or by an earlier upsert: the SDK updates `info`
    with every upsert, on replay too): each upsert costs Temporal a visibility write."""
    wanted: list[SearchAttributePair[Any]] = [
        SearchAttributePair(PAYOUT_STATE, state),
        SearchAttributePair(PAYOUT_ACCOUNT, account_id),
        SearchAttributePair(PAYOUT_ESCALATED, escalated),
    ]
    return [p for p in wanted if have.get(p.key) != p.value]
