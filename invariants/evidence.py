"""The evidence the invariant rules judge: plain values, gathered read-only by `invariants.checker`
and its sources, judged by the pure rules of `invariants.rules`. No I/O.

Evidence, and what it stands for:
* `writes`: audit rows carrying a token (FR-30). Rows with a `to_state` are the fenced payout
  transitions (each one is the UPDATE that stamped `payouts.fence = token`); `claim` and `post`
  also stamped the account's balance row.
* `attempts`/`proxy_fences`: the rail proxy's submissions and per-account high-water tokens.
* `movements`: the rail's own log, the evidence of money moving (one per accepted instruction).
* `grants`: the lock service's grant history, keys without the backend's namespace prefix;
  `grants_complete_since`: when the backend prunes it (etcd retention), grants that ended before
  this time may be missing, so INV-07 does not judge attempts and writes made before it.
* `ledger_subjects`: what the ledger proof query found (INV-03).
* `escalated`: payouts with an `ambiguity_escalated` audit row (INV-10).
* `workflows`: payout workflows whose latest run closed without completing (failed, terminated,
  timed out, canceled), from Temporal (INV-10); `workflows_checked` False when Temporal was not
  asked, `settled` True only when the caller knows the system has settled (INV-10's first rule).
* `holds`: the payout locks held by live sessions when they were read (`invariants.holds`), and
  `hold_bound_s`, how long one may go unused before its account counts as blocked (INV-10,
  `invariants.blocked`); `holds_checked` False when no holdings source was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from common.lockkey import PAYOUT_KEY_PREFIX
from railstub.client import RailMovement

#: How long a payout lock may go unused before its account counts as blocked (INV-10). Why 90 s:
#: the idle-lease sweeper's 60 s + its 5 s period + one release (7 s), rounded up generously; the
#: rule and its reasoning are in `invariants.blocked`. It lives here, beside the evidence that
#: carries it, so that the rule imports the evidence and nothing imports back.
HOLD_BOUND_S = 90.0


@dataclass(frozen=True, slots=True)
class HoldFact:
    """A payout lock held right now by a live session, as the lock service reports it."""

    key: str  # payout:{account_id}, without the backend's namespace prefix
    token: int
    session_id: str
    acquired_at: datetime  # the lock backend's clock
    observed_at: datetime  # when the holding was read (the backend's or the checker's clock)

    @property
    def account_id(self) -> str:
        return self.key.removeprefix(PAYOUT_KEY_PREFIX)


@dataclass(frozen=True, slots=True)
class Write:
    """An audit row carrying a token: a write presented under that token."""

    audit_id: int
    at: datetime
    token: int
    action: str
    payout_id: str | None
    account_id: str | None
    from_state: str | None
    to_state: str | None


@dataclass(frozen=True, slots=True)
class Transition:
    """An audited state change of a payout, token or not (INV-08 looks at all of them)."""

    audit_id: int
    payout_id: str
    from_state: str | None
    to_state: str


@dataclass(frozen=True, slots=True)
class PayoutRow:
    payout_id: str
    account_id: str
    state: str
    fence: int
    client_reference: str


@dataclass(frozen=True, slots=True)
class AttemptRow:
    attempt_id: int
    payout_id: str
    account_id: str
    client_reference: str
    token: int
    outcome: str | None
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class GrantFact:
    """One grant from the lock service's history. `ended_at` None: still valid (open-ended)."""

    key: str
    token: int
    acquired_at: datetime
    ended_at: datetime | None
    seq: int  # issue order among grants with the same acquired_at (history id, or list position)


class GrantHistory(list[GrantFact]):
    """Grants as a source returns them, with the horizon of a pruned history (None: complete)."""

    complete_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkflowFact:
    """A payout workflow whose latest run closed without completing (INV-10)."""

    workflow_id: str  # payout-{payout_id}
    status: str  # FAILED, TERMINATED, TIMED_OUT, CANCELED


@dataclass(slots=True)
class Evidence:
    writes: list[Write] = field(default_factory=list)  # ordered by audit_id
    transitions: list[Transition] = field(default_factory=list)  # ordered by audit_id
    payouts: list[PayoutRow] = field(default_factory=list)
    balance_fences: dict[str, int] = field(default_factory=dict)  # account -> stored fence
    attempts: list[AttemptRow] = field(default_factory=list)  # ordered by attempt_id
    proxy_fences: dict[str, int] = field(default_factory=dict)  # account -> high-water token
    movements: list[RailMovement] = field(default_factory=list)
    grants: list[GrantFact] = field(default_factory=list)
    grants_complete_since: datetime | None = None  # see the module docstring
    ledger_subjects: list[str] = field(default_factory=list)
    escalated: set[str] = field(default_factory=set)  # payout ids
    workflows: list[WorkflowFact] = field(default_factory=list)
    workflows_checked: bool = False
    settled: bool = False
    holds: list[HoldFact] = field(default_factory=list)
    holds_checked: bool = False
    hold_bound_s: float = HOLD_BOUND_S
