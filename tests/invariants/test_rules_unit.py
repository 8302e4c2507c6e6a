"""Unit tests of the pure rules (invariants.rules): the edges the integration tests do not
reach, each with the clean case beside it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from invariants.rules import (
    INVARIANTS,
    Evidence,
    GrantFact,
    PayoutRow,
    Transition,
    WorkflowFact,
    Write,
    check,
)
from railstub.client import RailMovement

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def grant(token: int, start: float, end: float | None, *, key: str = "payout:a") -> GrantFact:
    return GrantFact(
        key=key, token=token, acquired_at=at(start), ended_at=None if end is None else at(end),
        seq=token,
    )  # fmt: skip


def write(audit_id: int, token: int, when: float, to_state: str = "CLAIMED") -> Write:
    return Write(
        audit_id=audit_id, at=at(when), token=token, action="claim", payout_id="p",
        account_id="a", from_state="PENDING", to_state=to_state,
    )  # fmt: skip


def broken(ev: Evidence) -> set[str]:
    return {inv for inv, subjects in check(ev).items() if subjects}


def test_empty_evidence_reports_all_ten_invariants_as_zero() -> None:
    """Every invariant key is always present, zeros included."""
    assert check(Evidence()) == {inv: [] for inv in INVARIANTS}
    assert list(INVARIANTS) == [f"INV-{i:02d}" for i in range(1, 11)]


def test_touching_intervals_do_not_overlap_but_an_open_grant_does() -> None:
    """[0,5) then [5,..) is mutual exclusion; a later grant during an open one is not."""
    assert broken(Evidence(grants=[grant(1, 0, 5), grant(2, 5, None)])) == set()
    assert broken(Evidence(grants=[grant(1, 0, None), grant(2, 9, 10)])) == {"INV-06"}
    # Different keys never overlap each other.
    assert broken(Evidence(grants=[grant(1, 0, None), grant(2, 1, 2, key="payout:b")])) == set()


def test_tokens_are_checked_in_issue_order_not_token_order() -> None:
    """A lower token issued later (a restore without the bump) is INV-04."""
    assert broken(Evidence(grants=[grant(5, 0, 1), grant(3, 2, 3)])) == {"INV-04"}


def test_inv01_is_judged_by_the_tokens_the_account_had_seen() -> None:
    """A write under a token already superseded at the lock service but not yet at the account
    is ordered and allowed; a write below a token the account had seen is INV-01."""
    payout = PayoutRow("p", "a", "CLAIMED", 1, "p")
    base = Evidence(writes=[write(1, 1, 1.0)], payouts=[payout], balance_fences={"a": 1})
    base.grants = [grant(1, 0.0, 0.5), grant(2, 0.5, None)]
    assert broken(base) == set()
    other = Write(
        audit_id=2, at=at(1.5), token=2, action="claim", payout_id="q",
        account_id="a", from_state="PENDING", to_state="CLAIMED",
    )  # fmt: skip
    late = Write(
        audit_id=3, at=at(2.0), token=1, action="mark_submitted", payout_id="p",
        account_id="a", from_state="CLAIMED", to_state="RAIL_SUBMITTED",
    )  # fmt: skip
    q = PayoutRow("q", "a", "CLAIMED", 2, "q")
    p2 = PayoutRow("p", "a", "RAIL_SUBMITTED", 1, "p")
    ev = Evidence(writes=[write(1, 1, 1.0), other, late], payouts=[p2, q], balance_fences={"a": 2})
    ev.grants = [grant(1, 0.0, 0.5), grant(2, 0.5, None)]
    assert broken(ev) == {"INV-01"}


def test_an_audited_transition_out_of_a_terminal_state_is_inv08() -> None:
    """An audit row whose from_state is terminal is a violation even if the row now agrees."""
    ev = Evidence(
        transitions=[Transition(1, "p", "RAIL_ACKED", "POSTED"), Transition(2, "p", "POSTED", "CLAIMED")],
        payouts=[PayoutRow("p", "a", "CLAIMED", 0, "p")],
    )  # fmt: skip
    assert check(ev)["INV-08"] == ["p audit#2 POSTED->CLAIMED"]


def test_inv07_does_not_judge_writes_before_a_pruned_historys_horizon() -> None:
    """A write whose grant fell out of a pruned history (etcd retention) is not INV-07 when it
    was made before the horizon; the same write after the horizon still is."""
    before = Evidence(writes=[write(1, 5, when=10)], grants_complete_since=at(20))
    assert "INV-07" not in broken(before)
    after = Evidence(writes=[write(1, 5, when=30)], grants_complete_since=at(20))
    assert "INV-07" in broken(after)
    complete = Evidence(writes=[write(1, 5, when=10)])  # no horizon: the history is complete
    assert "INV-07" in broken(complete)


def moved(ref: str, status: str = "settled", mid: str = "m") -> RailMovement:
    return RailMovement(movement_id=f"{mid}-{ref}", client_reference=ref, amount=100, status=status)


def test_inv09_state_must_agree_with_the_rails_movements() -> None:
    """FAILED with money moved (settled or pending) and POSTED without exactly one movement are
    INV-09; FAILED after a decline, POSTED once, and ABANDONED-but-settled are not."""
    clean = Evidence(
        payouts=[
            PayoutRow("f", "a", "FAILED", 0, "f"),
            PayoutRow("p", "a", "POSTED", 0, "p"),
            PayoutRow("x", "a", "ABANDONED", 0, "x"),
        ],
        movements=[moved("f", "declined"), moved("p"), moved("x")],
    )
    assert check(clean)["INV-09"] == []
    dirty = Evidence(
        payouts=[
            PayoutRow("f", "a", "FAILED", 0, "f"),
            PayoutRow("g", "a", "FAILED", 0, "g"),
            PayoutRow("p", "a", "POSTED", 0, "p"),
        ],
        movements=[moved("f"), moved("g", "pending")],
    )
    assert check(dirty)["INV-09"] == [
        "f is FAILED but the rail moved money 1 time(s)",
        "g is FAILED but the rail moved money 1 time(s)",
        "p is POSTED with 0 rail movement(s) that moved money",
    ]


def test_inv10_stranded_payouts_only_once_settled() -> None:
    """Mid-run (not settled) an open payout is fine; settled, it must be terminal or escalated."""
    payouts = [
        PayoutRow("open", "a", "RAIL_SUBMITTED", 0, "open"),
        PayoutRow("amb", "a", "RAIL_AMBIGUOUS", 0, "amb"),
        PayoutRow("esc", "a", "RAIL_AMBIGUOUS", 0, "esc"),
        PayoutRow("done", "a", "POSTED", 0, "done"),
    ]
    assert check(Evidence(payouts=payouts, escalated={"esc"}))["INV-10"] == []
    assert check(Evidence(payouts=payouts, escalated={"esc"}, settled=True))["INV-10"] == [
        "amb is RAIL_AMBIGUOUS after settling (not escalated)",
        "open is RAIL_SUBMITTED after settling (not terminal)",
    ]


def test_inv10_a_closed_workflow_strands_a_non_terminal_payout() -> None:
    """A terminated/failed workflow of a non-terminal payout is INV-10 even mid-run; one whose
    payout is terminal (e.g. terminated after posting) is not."""
    ev = Evidence(
        payouts=[PayoutRow("a1", "a", "CLAIMED", 0, "a1"), PayoutRow("a2", "a", "POSTED", 0, "a2")],
        workflows=[WorkflowFact("payout-a1", "TERMINATED"), WorkflowFact("payout-a2", "FAILED")],
        workflows_checked=True,
    )
    assert check(ev)["INV-10"] == ["workflow payout-a1 is TERMINATED while the payout is CLAIMED"]
