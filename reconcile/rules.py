"""The reconciler's classification rules (UC-07, FR-26): pure functions over a snapshot.

Owns: the seven discrepancy classes and the decision of which evidence makes which break. Must
never: do I/O, repair anything, or drop a class from the report (all seven are always present, a
zero is reported as a zero).

The evidence of one closed window, gathered by `reconcile.reconciler`:
* payouts in scope (created in the window, or whose posting group was written in the window);
* the rail proxy's attempts for those payouts (plus attempts recorded in the window for payouts
  the payment database does not know);
* the rail's movement log entries for those client references (plus movements nobody recorded);
* the payouts' posting groups and their entries, the global proof query, and every payout that
  is RAIL_AMBIGUOUS now.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# The rail's movement record and its money-moved statuses are the rail's vocabulary (its client).
from railstub.client import MONEY_MOVED, RailMovement

DUPLICATE_SUBMISSION = "duplicate_submission"
SUBMISSION_WITHOUT_LEDGER = "submission_without_ledger"
LEDGER_WITHOUT_SUBMISSION = "ledger_without_submission"
BALANCE_MISMATCH = "balance_mismatch"
AMBIGUOUS_BEYOND_SLA = "ambiguous_beyond_sla"
MOVEMENT_WITHOUT_ATTEMPT = "movement_without_attempt"
#: An operator abandoned an ambiguous payout (after its SLA escalated) and the rail did move the
#: money: a known, accepted risk of abandoning, not a system fault, but finance must book it.
ABANDONED_BUT_SETTLED = "abandoned_but_settled"

#: Every class, in report order. The report always carries all seven keys.
CLASSES: tuple[str, ...] = (
    DUPLICATE_SUBMISSION,
    SUBMISSION_WITHOUT_LEDGER,
    LEDGER_WITHOUT_SUBMISSION,
    BALANCE_MISMATCH,
    AMBIGUOUS_BEYOND_SLA,
    MOVEMENT_WITHOUT_ATTEMPT,
    ABANDONED_BUT_SETTLED,
)

#: Attempt outcomes that may have reached the rail. NULL (in flight, or the outcome write was
#: lost) counts as possibly forwarded; only NOT_SUBMITTED is authoritative evidence of nothing.
POSSIBLY_FORWARDED = frozenset({"ACKED", "DECLINED", "UNKNOWN", None})
#: Non-terminal states whose last change after the window's end means "still being worked on".
IN_FLIGHT_STATES = frozenset({"CLAIMED", "RAIL_SUBMITTED", "RAIL_ACKED"})


@dataclass(frozen=True, slots=True)
class Window:
    """A closed, half-open time window [start, end)."""

    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class PayoutFact:
    payout_id: str
    account_id: str
    amount: int
    state: str
    client_reference: str
    created_at: datetime
    updated_at: datetime  # the time of its last transition (the paydb trigger stamps it)


@dataclass(frozen=True, slots=True)
class AttemptFact:
    attempt_id: int
    payout_id: str
    client_reference: str
    outcome: str | None


@dataclass(frozen=True, slots=True)
class PostingFact:
    """A payout's ledger group: its entries as (account_id, signed amount)."""

    group_id: str
    payout_id: str
    entries: tuple[tuple[str, int], ...]


@dataclass(slots=True)
class Evidence:
    window: Window
    payouts: list[PayoutFact] = field(default_factory=list)
    attempts: list[AttemptFact] = field(default_factory=list)  # for payouts in scope
    orphan_attempts: list[AttemptFact] = field(default_factory=list)  # payout unknown to paydb
    movements: list[RailMovement] = field(default_factory=list)  # in scope
    #: references of in-scope movements that have at least one attempt which may have forwarded
    references_with_attempt: set[str] = field(default_factory=set)
    postings: list[PostingFact] = field(default_factory=list)
    ledger_subjects: list[str] = field(default_factory=list)  # the proof query's accounts/groups
    ambiguous: list[PayoutFact] = field(default_factory=list)  # every RAIL_AMBIGUOUS payout now


@dataclass(frozen=True, slots=True)
class Findings:
    """Every subject id per class (unbounded; the report bounds the samples)."""

    subjects: dict[str, list[str]]
    checked_payouts: int


@dataclass(slots=True)
class _Index:
    """The evidence keyed the way the rules look it up."""

    by_ref: dict[str, PayoutFact]
    attempts_of: dict[str, list[AttemptFact]]
    movements_of: dict[str, list[RailMovement]]
    posting_of: dict[str, PostingFact]

    @classmethod
    def of(cls, ev: Evidence) -> _Index:
        movements_of: dict[str, list[RailMovement]] = defaultdict(list)
        for mv in ev.movements:
            movements_of[mv.client_reference].append(mv)
        return cls(
            by_ref={p.client_reference: p for p in ev.payouts},
            attempts_of=_group(ev.attempts),
            movements_of=movements_of,
            posting_of={g.payout_id: g for g in ev.postings},
        )


def classify(ev: Evidence, *, ambiguity_sla: timedelta, rail_clearing: str) -> Findings:
    """Apply the seven rules. Pure: the same evidence always gives the same findings."""
    found: dict[str, set[str]] = {c: set() for c in CLASSES}
    ix = _Index.of(ev)
    found[DUPLICATE_SUBMISSION] = _duplicates(ev, ix)
    for p in ev.payouts:
        for cls in _payout_breaks(p, ev.window, ix, rail_clearing):
            found[cls].add(p.payout_id)
    for a in ev.orphan_attempts:
        if a.outcome == "ACKED":  # acknowledged by the rail, and no payout to post it against
            found[SUBMISSION_WITHOUT_LEDGER].add(a.payout_id)
    found[BALANCE_MISMATCH].update(ev.ledger_subjects)
    found[AMBIGUOUS_BEYOND_SLA] = {
        p.payout_id for p in ev.ambiguous if ev.window.end - p.updated_at > ambiguity_sla
    }
    found[MOVEMENT_WITHOUT_ATTEMPT] = {
        mv.movement_id
        for mv in ev.movements
        if mv.client_reference not in ev.references_with_attempt
    }
    return Findings(
        subjects={c: sorted(found[c]) for c in CLASSES}, checked_payouts=len(ev.payouts)
    )


def _duplicates(ev: Evidence, ix: _Index) -> set[str]:
    """The rail saw a reference twice, or the proxy let two possibly-forwarded attempts through."""
    out = {
        ix.by_ref[ref].payout_id if ref in ix.by_ref else ref
        for ref, mvs in ix.movements_of.items()
        if len(mvs) > 1
    }
    for payout_id, attempts in _group(ev.attempts + ev.orphan_attempts).items():
        if sum(a.outcome in POSSIBLY_FORWARDED for a in attempts) > 1:
            out.add(payout_id)
    return out


def _payout_breaks(p: PayoutFact, window: Window, ix: _Index, rail_clearing: str) -> list[str]:
    attempts = ix.attempts_of.get(p.payout_id, [])
    on_rail = any(mv.status in MONEY_MOVED for mv in ix.movements_of.get(p.client_reference, []))
    posting = ix.posting_of.get(p.payout_id)
    breaks = []
    moved = on_rail or any(a.outcome == "ACKED" for a in attempts)
    # A non-terminal payout that changed state after the window closed is still being worked on
    # (e.g. between RAIL_ACKED and POSTED): not a break yet. RAIL_AMBIGUOUS has its own rule (the
    # resolution SLA), so it is never a submission-without-ledger break either.
    in_flight = p.state in IN_FLIGHT_STATES and p.updated_at >= window.end
    if on_rail and p.state == "ABANDONED":
        # Its own class: the operator accepted this risk when abandoning (UC-06), so it is not
        # reported as a system's submission-without-ledger, but the money did leave.
        breaks.append(ABANDONED_BUT_SETTLED)
    elif moved and p.state not in ("POSTED", "RAIL_AMBIGUOUS") and not in_flight:
        breaks.append(SUBMISSION_WITHOUT_LEDGER)
    # A posting needs both halves of the evidence: an attempt that may have reached the rail
    # (ambiguous-then-settled has UNKNOWN, not ACKED) and the rail's own record of the money.
    forwarded = any(a.outcome in ("ACKED", "UNKNOWN", None) for a in attempts)
    if posting is not None and not (forwarded and on_rail):
        breaks.append(LEDGER_WITHOUT_SUBMISSION)
    if not _posting_matches(p, posting, rail_clearing):
        breaks.append(BALANCE_MISMATCH)
    return breaks


def _group(attempts: Iterable[AttemptFact]) -> dict[str, list[AttemptFact]]:
    out: dict[str, list[AttemptFact]] = defaultdict(list)
    for a in attempts:
        out[a.payout_id].append(a)
    return out


def _posting_matches(p: PayoutFact, posting: PostingFact | None, rail_clearing: str) -> bool:
    """Per payout: POSTED iff a group exists, and the group is exactly {A -X, clearing +X}."""
    if p.state != "POSTED":
        return posting is None
    if posting is None:
        return False
    expected: Sequence[tuple[str, int]] = sorted(
        [(p.account_id, -p.amount), (rail_clearing, p.amount)]
    )
    return sorted(posting.entries) == expected
