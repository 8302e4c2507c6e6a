"""Inputs and outputs of every activity, shared by the workflows and the activity implementations.

Dataclasses with defaults, so that fields can be added compatibly (STYLE: one versionable input
per activity). Pure data: no I/O, safe to import from workflow code.
"""

from dataclasses import dataclass, field
from typing import Any

# Activity names: the workflow refers to activities by these names so that workflow modules do
# not import activity implementations (and their database and HTTP clients).
ACQUIRE_LOCK = "acquire_lock"
REREAD_AND_CLAIM = "reread_and_claim"
SUBMIT_TO_RAIL = "submit_to_rail"
RECOVER_FROM_ATTEMPT = "recover_from_attempt"
POST_TO_LEDGER = "post_to_ledger"
RELEASE_LOCK = "release_lock"
#: The merged holder step (patch `merged-holder-steps`): re-read + claim, submit (once), post,
#: and the release of the grant at the end, as one activity on the holder's queue.
EXECUTE_PAYOUT = "execute_payout"
LOOKUP_RAIL = "lookup_rail"
RESOLVE_AMBIGUOUS = "resolve_ambiguous"
ABANDON_PAYOUT = "abandon_payout"
ESCALATE_AMBIGUOUS = "escalate_ambiguous"
REVOKE_LOCK = "revoke_lock"
RECORD_SIGNAL_REJECTED = "record_signal_rejected"
RECONCILE = "reconcile"

#: Error types raised by activities as non-retryable ApplicationErrors.
FENCED_OUT = "FencedOut"
LOCK_LOST = "LockLost"
INVALID_TRANSITION = "InvalidTransition"
UNKNOWN_PAYOUT = "UnknownPayout"
#: The payment store refused an operator command's assertion (lockservice.assertions).
ASSERTION_REFUSED = "OperatorAssertionRefused"


@dataclass
class SignalRejection:
    signal: str
    operator: str
    reason: str
    why: str


@dataclass
class OperatorCommand:
    """Input of the `abandon` and `revoke` signals: who, and why (FR-30).

    `operator` is free text and proves nothing (anyone who can reach Temporal can signal);
    `assertion` is the lock service's signed operator assertion (lockservice.assertions, its
    JSON form) that the enforcement points verify and whose identity they audit. Histories
    recorded before it existed carry none.
    """

    operator: str = ""
    reason: str = ""
    assertion: dict[str, Any] | None = None


@dataclass
class AttemptView:
    """The rail proxy's record of the latest submission attempt for a payout."""

    attempt_id: str
    outcome: str | None  # ACKED, DECLINED, UNKNOWN, NOT_SUBMITTED, or None while in flight
    token: int = 0
    recorded_at: str = ""


@dataclass
class CarriedState:
    """What one run of PayoutWorkflow hands to the next when it continues as new.

    Everything the workflow knows that the payment database does not: the operator commands it
    accepted but has not carried out yet, the rejections it reported, and when the ambiguity
    began (the resolution SLA is measured from there, not from the start of the latest run).
    """

    state: str
    token: int = 0
    attempt: AttemptView | None = None
    client_reference: str = ""
    escalated: bool = False
    ambiguous_since: str | None = None  # ISO-8601 UTC, workflow time
    resolution: str = ""  # "settled" or "absent" when known and not yet written
    abandon: OperatorCommand | None = None  # accepted, not yet carried out
    pending_revokes: list[OperatorCommand] = field(default_factory=list)
    rejected_signals: list[SignalRejection] = field(default_factory=list)
    last_error: str = ""
    runs: int = 1  # how many runs this payout's workflow has had before this one


@dataclass
class PayoutInput:
    """Input of PayoutWorkflow (workflow id `payout-{payout_id}`)."""

    payout_id: str
    account_id: str
    correlation_id: str = ""
    # How long one acquire waits for the account's previous payout to release its lock. Long,
    # so a queue of payouts on one account hands the lock on by NOTIFY instead of by retries
    # (each retry costs Temporal an activity, a timer and two workflow tasks).
    acquire_wait_s: float = 30.0
    base_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    submit_deadline_s: float = 30.0
    lookup_interval_s: float = 30.0
    resolution_sla_s: float = 4 * 3600.0  # escalate after four hours
    # How long a critical-section step may wait for the lock holder's worker to pick it up
    # before the workflow concludes that worker is gone and re-acquires.
    holder_pickup_s: float = 10.0
    # How long a running critical-section step may go without a heartbeat before the workflow
    # treats its worker as dead (every critical-section step heartbeats every second while it
    # runs, also while it waits on a contended row lock).
    holder_heartbeat_timeout_s: float = 10.0
    # Reads, lookups, escalation, audit and revoke retry without an attempt limit; this caps the
    # backoff between two attempts (an outage only delays a payout,
    # docs/architecture.md#workflow-shape).
    read_retry_max_interval_s: float = 30.0
    # Continue as new after this many lookups in one run (or when Temporal suggests it), so an
    # ambiguous payout awaiting an operator never reaches the history limit. At the default
    # lookup interval (30 s) this is one run per 2.5 hours, about 3,300 history events.
    max_lookups_per_run: int = 300
    # State carried over from the previous run of this workflow (continue-as-new); None on the
    # first run. A field with a default, so inputs recorded before it existed still decode.
    carried: CarriedState | None = None


@dataclass
class WorkContext:
    """Command context (STD01-04) carried into every activity, proxy call and event."""

    correlation_id: str
    causation_id: str = ""
    deadline_at: str | None = None  # absolute ISO-8601 UTC; None where no deadline applies


@dataclass
class AcquireRequest:
    payout_id: str
    account_id: str
    wait_s: float
    context: WorkContext


@dataclass
class AcquireResult:
    acquired: bool
    token: int = 0
    worker_queue: str = ""  # the task queue of the worker process that holds the session
    reason: str = ""  # "held", "timeout", "unavailable" when not acquired


@dataclass
class StepRequest:
    payout_id: str
    account_id: str
    token: int
    context: WorkContext
    operator: str = ""
    reason: str = ""
    resolution: str = ""  # for resolve_ambiguous: "settled" or "absent"
    assertion: dict[str, Any] | None = None  # for abandon_payout: the operator assertion


@dataclass
class PayoutView:
    payout_id: str
    account_id: str
    state: str
    amount: int = 0
    fence: int = 0
    client_reference: str = ""
    failure_reason: str | None = None
    attempt: AttemptView | None = None
    handoff_certainty: str = (
        ""  # set by submit_to_rail: NOT_SUBMITTED, ACKNOWLEDGED, FINAL, UNKNOWN
    )
    detail: str = ""  # e.g. "already_advanced", the proxy's rejection code
    #: execute_payout only: the UC-01 steps it carried out, in order ("claim", "submit",
    #: "post", "release"; see `STEPS`), as the activity's result shows them in the Temporal UI.
    steps: list[str] = field(default_factory=list)
    #: execute_payout only: the grant was released at the end of the activity; the workflow
    #: schedules no separate release.
    released: bool = False


@dataclass
class LookupRequest:
    payout_id: str
    client_reference: str
    context: WorkContext


@dataclass
class LookupResult:
    status: str  # "settled", "declined", "absent", "pending", "unavailable"
    detail: str = ""


@dataclass
class RevokeRequest:
    account_id: str
    operator: str
    reason: str
    payout_id: str = ""
    assertion: dict[str, Any] | None = None  # the signal's operator assertion


@dataclass
class PayoutStatus:
    """What the `status` query returns."""

    payout_id: str
    state: str
    token: int
    attempt: AttemptView | None
    escalated: bool
    rejected_signals: list[SignalRejection] = field(default_factory=list)
    last_error: str = ""
    pending_revokes: int = 0  # accepted revoke commands not carried out yet
    runs: int = 1  # this run and the ones it continued from
