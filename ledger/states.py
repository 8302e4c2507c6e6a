"""THE payout state machine (FR-22, INV-08): states, edges, terminal set.

Documented, with when each edge is taken, in docs/architecture.md#payout-state-machine.

The store, the database trigger (via the `payout_transitions` table, checked equal to this one by
a test) and the workflow all use this one table. Pure: no I/O.
"""

from __future__ import annotations

from enum import StrEnum

from ledger.errors import InvalidTransition, UnknownState


class PayoutState(StrEnum):
    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    RAIL_SUBMITTED = "RAIL_SUBMITTED"
    RAIL_AMBIGUOUS = "RAIL_AMBIGUOUS"
    RAIL_ACKED = "RAIL_ACKED"
    POSTED = "POSTED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"

    @classmethod
    def parse(cls, value: str | PayoutState) -> PayoutState:
        """The state named `value`, or UnknownState (a typed error, not a ValueError)."""
        try:
            return cls(value)
        except ValueError:
            raise UnknownState(f"unknown payout state {value!r}") from None


S = PayoutState

#: Every allowed edge (docs/architecture.md#payout-state-machine). Anything else is rejected, here
#: and in the DB.
TRANSITIONS: frozenset[tuple[PayoutState, PayoutState]] = frozenset(
    {
        (S.PENDING, S.CLAIMED),
        (S.PENDING, S.FAILED),
        (S.CLAIMED, S.RAIL_SUBMITTED),
        (S.RAIL_SUBMITTED, S.RAIL_ACKED),
        (S.RAIL_SUBMITTED, S.FAILED),
        (S.RAIL_SUBMITTED, S.RAIL_AMBIGUOUS),
        (S.RAIL_AMBIGUOUS, S.RAIL_ACKED),
        (S.RAIL_AMBIGUOUS, S.FAILED),
        (S.RAIL_AMBIGUOUS, S.ABANDONED),
        (S.RAIL_ACKED, S.POSTED),
    }
)

TERMINAL_STATES: frozenset[PayoutState] = frozenset({S.POSTED, S.FAILED, S.ABANDONED})

#: States whose amount is committed to the rail (or may be): they count against available funds.
IN_FLIGHT_STATES: frozenset[PayoutState] = frozenset(
    {S.CLAIMED, S.RAIL_SUBMITTED, S.RAIL_AMBIGUOUS, S.RAIL_ACKED}
)


def check_transition(from_state: PayoutState, to_state: PayoutState) -> None:
    """Raise InvalidTransition unless (from_state, to_state) is an edge of the table."""
    if (from_state, to_state) not in TRANSITIONS:
        raise InvalidTransition(f"{from_state} -> {to_state} is not an allowed transition")


def successors(state: PayoutState) -> frozenset[PayoutState]:
    return frozenset(to for (frm, to) in TRANSITIONS if frm == state)


def reachable_from(state: PayoutState) -> frozenset[PayoutState]:
    """Every state reachable from `state` in one or more steps (the table is acyclic)."""
    seen: set[PayoutState] = set()
    frontier = [state]
    while frontier:
        for nxt in successors(frontier.pop()):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return frozenset(seen)
