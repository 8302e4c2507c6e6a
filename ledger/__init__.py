"""The payment database: the first fencing enforcement point (FR-14..FR-16, FR-25, FR-30).

Owns, in PostgreSQL schema `paydb`: accounts, balances (with a fence), payouts (with a fence and
the state machine of docs/architecture.md#payout-state-machine), double-entry ledger groups and
entries, the audit log, the transactional outbox rows, and the operator commands (abandon,
revoke) the payout workflows accepted, each with its assertion's nonce (single use).

It must never:
* accept a write presenting a token below the stored fence (INV-05) — equal is accepted, it is the
  same grant's next step;
* with a grant verifier (as the worker builds the store), accept a fenced write whose signed
  grant is not the lock service's for the payout's account and the token (INV-07, `InvalidGrant`);
* leave a ledger group unbalanced, or let a balance drift from the sum of its entries (INV-03);
* move a payout out of a terminal state (INV-08), or along an edge not in the transition table;
* accept an operator assertion's nonce twice, or end an operator command twice.

Public surface: `PayoutStore`, `WorkContext`, `Payout`, `AlreadyAdvanced`, `PayoutState`, the
errors of `ledger.errors`, and the proof query `ledger.queries.ledger_discrepancies`.
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from ledger.context import WorkContext
    from ledger.errors import (
        AlreadyExists,
        DuplicateAccount,
        DuplicatePayout,
        FencedOut,
        InvalidAmount,
        InvalidGrant,
        InvalidIdentifier,
        InvalidInput,
        InvalidToken,
        InvalidTransition,
        PaydbError,
        UnknownAccount,
        UnknownPayout,
        UnknownState,
    )
    from ledger.states import TERMINAL_STATES, TRANSITIONS, PayoutState, check_transition
    from ledger.store import AlreadyAdvanced, CommandVerdict, Payout, PayoutStore, lock_key

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "TERMINAL_STATES": "ledger.states",
    "TRANSITIONS": "ledger.states",
    "AlreadyAdvanced": "ledger.store",
    "AlreadyExists": "ledger.errors",
    "CommandVerdict": "ledger.store",
    "DuplicateAccount": "ledger.errors",
    "DuplicatePayout": "ledger.errors",
    "FencedOut": "ledger.errors",
    "InvalidAmount": "ledger.errors",
    "InvalidGrant": "ledger.errors",
    "InvalidIdentifier": "ledger.errors",
    "InvalidInput": "ledger.errors",
    "InvalidToken": "ledger.errors",
    "InvalidTransition": "ledger.errors",
    "PaydbError": "ledger.errors",
    "Payout": "ledger.store",
    "PayoutState": "ledger.states",
    "PayoutStore": "ledger.store",
    "UnknownAccount": "ledger.errors",
    "UnknownPayout": "ledger.errors",
    "UnknownState": "ledger.errors",
    "WorkContext": "ledger.context",
    "check_transition": "ledger.states",
    "lock_key": "ledger.store",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "AlreadyAdvanced",
    "AlreadyExists",
    "CommandVerdict",
    "DuplicateAccount",
    "DuplicatePayout",
    "FencedOut",
    "InvalidAmount",
    "InvalidGrant",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidToken",
    "InvalidTransition",
    "PaydbError",
    "Payout",
    "PayoutState",
    "PayoutStore",
    "UnknownAccount",
    "UnknownPayout",
    "UnknownState",
    "WorkContext",
    "check_transition",
    "lock_key",
]
