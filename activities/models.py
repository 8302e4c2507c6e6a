"""Inputs and outputs of every activity, shared by the workflows and the activity implementations.

Dataclasses with defaults, so that fields can be added compatibly (STYLE: one versionable input
per activity). Pure data: no I/O, safe to import from workflow code.
"""

from dataclasses import dataclass, field
from typing import Any

# Activity names: the workflow refers to activities by these names so that workflow modules do
# not import activity implementations (and their database and HTTP clients).
ACQUIRE_LOCK = "acquire_lock"
SUBMIT_TO_RAIL = "submit_to_rail"
RECOVER_FROM_ATTEMPT = "recover_from_attempt"
POST_TO_LEDGER = "post_to_ledger"
RELEASE_LOCK = "release_lock"
#: The merged holder step: re-read + claim, submit (once), post,
#: and the release of the grant at the end, as one activity on the holder's queue.
EXECUTE_PAYOUT = "execute_payout"
#: The two-task happy path (issue 29): acquire, then the merged
#: holder step in the same activity, run by the worker that got the grant.
ACQUIRE_AND_EXECUTE = "acquire_and_execute"
LOOKUP_RAIL = "lookup_rail"
RESOLVE_AMBIGUOUS = "resolve_ambiguous"
ABANDON_PAYOUT = "abandon_payout"
ESCALATE_AMBIGUOUS = "escalate_ambiguous"
RECORD_SIGNAL_REJECTED = "record_signal_rejected"
#: Operator commands (issue 24): verified and recorded once at acceptance by the
#: payment store, ended once (carried out or refused), each end with one audit row.
ACCEPT_OPERATOR_COMMAND = "accept_operator_command"
SETTLE_OPERATOR_COMMAND = "settle_operator_command"
CARRY_OUT_REVOKE = "carry_out_revoke"
RECONCILE = "reconcile"

#: Error types raised by activities as non-retryable ApplicationErrors.
FENCED_OUT = "FencedOut"
LOCK_LOST = "LockLost"
INVALID_TRANSITION = "InvalidTransition"
UNKNOWN_PAYOUT = "UnknownPayout"
#: The payment store refused an operator command's assertion (lockservice.verifiers.assertions).
ASSERTION_REFUSED = "OperatorAssertionRefused"
#: An operator command sent as a workflow Update was refused: the update fails with this type.
COMMAND_REFUSED = "OperatorCommandRefused"


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
    `assertion` is the lock service's signed operator assertion
    (lockservice.verifiers.assertions, its JSON form) that the enforcement points verify and
    whose identity they audit. Histories recorded before it existed carry none.
    """

    operator: str = ""
    reason: str = ""
    assertion: dict[str, Any] | None = None


@dataclass
class CommandRecord:
    """One operator command as the workflow knows it (status query, carried across runs).

    `status`: verifying (its assertion is being checked by the payment store), pending
    (accepted, not carried out yet), carried_out, or refused. `actor` is the identity the payment
    store authenticated, or `unverified:<claim>` for a name nobody checked. `assertion` is kept
    only while the command is pending (a revoke presents it to the lock server).
    """

    command_id: str
    action: str
    via: str  # "signal" or "update"
    operator: str = ""  # the name the sender typed; proves nothing
    reason: str = ""
    status: str = "verifying"
    actor: str = ""
    why: str = ""  # the refusal, or what was done
    at: str = ""  # workflow time (ISO-8601) of its latest status
    assertion: dict[str, Any] | None = None


@dataclass
class CommandRequest:
    """accept_operator_command: judge one command (idempotent per `command_id`)."""

    command_id: str
    payout_id: str
    account_id: str
    action: str
    via: str
    operator: str = ""
    reason: str = ""
    assertion: dict[str, Any] | None = None


@dataclass
class CommandVerdict:
    """The payment store's verdict (ledger.store.commands); `outcome` None: accepted, pending."""

    command_id: str
    accepted: bool
    actor: str = ""
    reason: str = ""
    outcome: str | None = None
    code: str = ""
    why: str = ""


@dataclass
class CommandSettlement:
    """settle_operator_command: end an accepted command that will not be carried out."""

    command_id: str
    payout_id: str
    why: str
    code: str = ""


@dataclass
class LookupRecord:
    """The latest rail lookup of an ambiguous payout, for the status query."""

    number: int  # 1 for the first lookup of the payout, across runs
    status: str
    detail: str = ""
    at: str = ""  # workflow time, ISO-8601


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
    rejected_signals: list[SignalRejection] = field(default_factory=list)
    last_error: str = ""
    runs: int = 1  # how many runs this payout's workflow has had before this one
    #: The operator commands (all pending ones, and the latest ended ones).
    commands: list[CommandRecord] = field(default_factory=list)
    evidence: str = ""  # what the rail said that decided `resolution`
    lookups: int = 0  # lookups of this payout in all runs before this one
    last_lookup: LookupRecord | None = None
    cancel_requests: int = 0


@dataclass
class PayoutInput:
    """Input of PayoutWorkflow (workflow id `payout-{payout_id}`)."""

    payout_id: str
    account_id: str
    correlation_id: str = ""
    amount: int = 0  # minor units, for what the Temporal UI shows (0: not given by the starter)
    #: The two-task happy path (acquire_and_execute, issue 29); False: the
    #: acquire and the merged holder step as two activities (issue 29's A/B).
    two_task: bool = True
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
class RunRequest:
    """acquire_and_execute: the acquire, then execute_payout under the grant it got."""

    acquire: AcquireRequest
    #: The submit's deadline, counted from when the grant was obtained (not from scheduling:
    #: the acquire may have waited for the account's previous payout).
    submit_deadline_s: float = 30.0


@dataclass
class StepFailure:
    """How the critical section part of acquire_and_execute failed, for the workflow to act on
    exactly as on a failed execute_payout (`type` is an error type of this module, or "")."""

    type: str
    message: str


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
    #: abandon_payout: the command the payment store accepted; the
    #: abandon is carried out under that acceptance, after one last lookup of the rail.
    command_id: str = ""


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
    #: abandon_payout only: the rail's evidence found by its last lookup ("settled", "declined",
    #: "absent"), in which case nothing was abandoned: evidence outranks the command.
    evidence: str = ""


@dataclass
class RunResult:
    """acquire_and_execute's answer: the grant (acquired or why not), and once acquired the view
    execute_payout returned, or how it failed."""

    grant: AcquireResult
    view: PayoutView | None = None
    failure: StepFailure | None = None


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
    command_id: str = ""  # carry_out_revoke: the accepted command it ends


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
    account_id: str = ""
    #: A rail outcome known from a lookup ("settled" or "absent") and not yet written: it is
    #: applied under the next grant, and an abandon meanwhile is refused naming it.
    resolution: str = ""
    evidence: str = ""
    lookups: int = 0  # of this payout, in every run
    last_lookup: LookupRecord | None = None
    #: Operator commands, pending and ended, with their verdicts (assertions left out).
    commands: list[CommandRecord] = field(default_factory=list)
    cancel_requests: int = 0  # refused (a payout workflow is never cancelled)
