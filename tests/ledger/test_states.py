"""Unit tests of the payout state machine (docs/architecture.md#payout-state-machine): pure, no
database."""

from __future__ import annotations

import itertools

import pytest

from ledger import TERMINAL_STATES, TRANSITIONS, InvalidTransition, PayoutState, UnknownState
from ledger.states import check_transition, reachable_from, successors

S = PayoutState

#: The table of docs/architecture.md#payout-state-machine, copied by hand so that a change to the
#: code table fails this test.
EXPECTED = {
    ("PENDING", "CLAIMED"),
    ("PENDING", "FAILED"),
    ("CLAIMED", "RAIL_SUBMITTED"),
    ("RAIL_SUBMITTED", "RAIL_ACKED"),
    ("RAIL_SUBMITTED", "FAILED"),
    ("RAIL_SUBMITTED", "RAIL_AMBIGUOUS"),
    ("RAIL_AMBIGUOUS", "RAIL_ACKED"),
    ("RAIL_AMBIGUOUS", "FAILED"),
    ("RAIL_AMBIGUOUS", "ABANDONED"),
    ("RAIL_ACKED", "POSTED"),
}


def test_table_is_exactly_the_architecture() -> None:
    """The code's transition table equals the documented one edge for edge."""
    assert {(str(a), str(b)) for a, b in TRANSITIONS} == EXPECTED


@pytest.mark.parametrize(("frm", "to"), list(itertools.product(S, S)))
def test_every_pair_is_accepted_iff_listed(frm: PayoutState, to: PayoutState) -> None:
    """check_transition accepts exactly the listed pairs and raises InvalidTransition otherwise."""
    if (str(frm), str(to)) in EXPECTED:
        check_transition(frm, to)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(frm, to)


def test_terminal_states_have_no_outgoing_edge() -> None:
    """POSTED, FAILED and ABANDONED are terminal and nothing leaves them (INV-08)."""
    assert {str(s) for s in TERMINAL_STATES} == {"POSTED", "FAILED", "ABANDONED"}
    for state in TERMINAL_STATES:
        assert successors(state) == frozenset()
    for state in set(S) - TERMINAL_STATES:
        assert successors(state), f"{state} is a dead end but not terminal"


def test_every_state_reaches_a_terminal_state_and_no_cycle() -> None:
    """Every non-terminal state can finish, and no state reaches itself (the table is acyclic)."""
    for state in S:
        reach = reachable_from(state)
        assert state not in reach
        if state not in TERMINAL_STATES:
            assert reach & TERMINAL_STATES


def test_ambiguous_can_never_go_back_to_submission() -> None:
    """RAIL_AMBIGUOUS can never reach CLAIMED or RAIL_SUBMITTED again (FR-23)."""
    assert not reachable_from(S.RAIL_AMBIGUOUS) & {S.CLAIMED, S.RAIL_SUBMITTED, S.PENDING}


def test_unknown_state_name_is_a_typed_error() -> None:
    """Parsing a state name that does not exist raises UnknownState, not ValueError."""
    assert PayoutState.parse("POSTED") is S.POSTED
    with pytest.raises(UnknownState):
        PayoutState.parse("SETTLED")
