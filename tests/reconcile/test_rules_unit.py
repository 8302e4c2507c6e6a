"""Unit tests of the pure classification rules (no I/O): edge cases the integration scenarios
do not reach."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from railstub.client import RailMovement
from reconcile.rules import (
    CLASSES,
    AttemptFact,
    Evidence,
    PayoutFact,
    PostingFact,
    Window,
    classify,
)

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
WINDOW = Window(start=T0, end=T0 + timedelta(hours=1))
SLA = timedelta(hours=4)


def payout(
    state: str, pid: str = "po-1", amount: int = 100, updated: datetime | None = None
) -> PayoutFact:
    at = T0 + timedelta(minutes=1)
    return PayoutFact(pid, "acct-1", amount, state, pid, at, updated or at)


def attempt(outcome: str | None, pid: str = "po-1", n: int = 1) -> AttemptFact:
    return AttemptFact(n, pid, pid, outcome)


def movement(status: str, ref: str = "po-1", mid: str = "m-1") -> RailMovement:
    return RailMovement(mid, ref, 100, status)


def found(ev: Evidence) -> dict[str, list[str]]:
    subjects = classify(ev, ambiguity_sla=SLA, rail_clearing="rail_clearing").subjects
    assert set(subjects) == set(CLASSES)
    return {c: ids for c, ids in subjects.items() if ids}


def test_failed_payout_whose_money_moved_is_a_submission_without_ledger() -> None:
    """FAILED (e.g. wrongly resolved absent) while the rail settled it: money left unbooked."""
    ev = Evidence(
        WINDOW,
        payouts=[payout("FAILED")],
        attempts=[attempt("UNKNOWN")],
        movements=[movement("settled")],
        references_with_attempt={"po-1"},
    )
    assert found(ev) == {"submission_without_ledger": ["po-1"]}


def test_declined_movement_is_not_money_moved() -> None:
    """A declined payout with a declined rail movement is clean."""
    ev = Evidence(
        WINDOW,
        payouts=[payout("FAILED")],
        attempts=[attempt("DECLINED")],
        movements=[movement("declined")],
        references_with_attempt={"po-1"},
    )
    assert found(ev) == {}


def test_orphan_acked_attempt_is_a_submission_without_ledger() -> None:
    """An ACKED attempt for a payout the payment database does not know is unbooked money."""
    ev = Evidence(WINDOW, orphan_attempts=[attempt("ACKED", pid="po-ghost")])
    assert found(ev) == {"submission_without_ledger": ["po-ghost"]}


def test_posting_with_wrong_amount_is_a_per_payout_balance_mismatch() -> None:
    """A POSTED payout whose group moved another amount breaks the per-payout balance check."""
    posting = PostingFact("g-1", "po-1", (("acct-1", -99), ("rail_clearing", 99)))
    ev = Evidence(
        WINDOW,
        payouts=[payout("POSTED")],
        attempts=[attempt("ACKED")],
        movements=[movement("settled")],
        references_with_attempt={"po-1"},
        postings=[posting],
    )
    assert found(ev) == {"balance_mismatch": ["po-1"]}


def test_posted_without_group_is_a_balance_mismatch() -> None:
    """POSTED with no ledger group means the ledger does not reflect the payout."""
    ev = Evidence(
        WINDOW,
        payouts=[payout("POSTED")],
        attempts=[attempt("ACKED")],
        movements=[movement("settled")],
        references_with_attempt={"po-1"},
    )
    assert found(ev) == {"balance_mismatch": ["po-1"]}


def test_not_submitted_attempt_does_not_explain_a_movement() -> None:
    """Only an attempt that may have forwarded explains a movement; NOT_SUBMITTED contradicts it."""
    ev = Evidence(
        WINDOW,
        payouts=[payout("PENDING")],
        attempts=[attempt("NOT_SUBMITTED")],
        movements=[movement("settled")],
    )
    assert found(ev) == {"submission_without_ledger": ["po-1"], "movement_without_attempt": ["m-1"]}


def test_not_submitted_retry_is_not_a_duplicate() -> None:
    """A NOT_SUBMITTED attempt followed by a live one is one submission, not two."""
    posting = PostingFact("g-1", "po-1", (("acct-1", -100), ("rail_clearing", 100)))
    ev = Evidence(
        WINDOW,
        payouts=[payout("POSTED")],
        attempts=[attempt("NOT_SUBMITTED"), attempt("ACKED", n=2)],
        movements=[movement("settled")],
        references_with_attempt={"po-1"},
        postings=[posting],
    )
    assert found(ev) == {}


def test_ambiguity_sla_is_measured_at_the_window_end() -> None:
    """Ambiguous for exactly the SLA is not yet beyond it; one second more is."""
    at_sla = payout("RAIL_AMBIGUOUS", pid="po-a", updated=WINDOW.end - SLA)
    beyond = payout("RAIL_AMBIGUOUS", pid="po-b", updated=WINDOW.end - SLA - timedelta(seconds=1))
    ev = Evidence(WINDOW, ambiguous=[at_sla, beyond])
    assert found(ev) == {"ambiguous_beyond_sla": ["po-b"]}


def test_abandoned_payout_the_rail_settled_is_its_own_class() -> None:
    """ABANDONED by an operator while the rail moved the money: `abandoned_but_settled`, not a
    system's submission-without-ledger; an abandoned payout the rail never moved is clean."""
    settled = Evidence(
        WINDOW,
        payouts=[payout("ABANDONED")],
        attempts=[attempt("UNKNOWN")],
        movements=[movement("settled")],
        references_with_attempt={"po-1"},
    )
    assert found(settled) == {"abandoned_but_settled": ["po-1"]}
    never_moved = Evidence(WINDOW, payouts=[payout("ABANDONED")], attempts=[attempt("UNKNOWN")])
    assert found(never_moved) == {}
