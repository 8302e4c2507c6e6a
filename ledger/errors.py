"""Typed errors of the payment database. One base class; a fenced rejection is its own type.

PaydbError
 +-- FencedOut              presented token below the stored fence (FR-16); abort, never retry
 +-- InvalidGrant           the grant is not the lock service's signed grant of the payout's
 |                          account key for this token, or it expired (INV-07); nothing written
 +-- InvalidOperatorAssertion  a break-glass command (abandon) without the lock service's
 |                          operator assertion for it, or forged/expired/for another payout
 +-- InvalidTransition      the pair is not in the table, or the payout is behind/elsewhere
 +-- UnknownAccount         no such account (or not a customer account where one is needed)
 +-- UnknownPayout          no such payout
 +-- AlreadyExists
 |    +-- DuplicatePayout
 |    +-- DuplicateAccount
 +-- InvalidInput           nothing was written
      +-- InvalidAmount     not an int, <= 0, or beyond bigint
      +-- InvalidIdentifier empty or malformed account/payout id, missing reason/operator
      +-- InvalidToken      not an int in 1..bigint
      +-- UnknownState      a state name that is not a PayoutState
"""

from __future__ import annotations


class PaydbError(Exception):
    """Base class of every payment-database error. `code` is a stable machine-readable name."""

    code = "paydb_error"


class FencedOut(PaydbError):
    """A write presented a token lower than the fence stored on the row it targets."""

    code = "fenced_out"

    def __init__(self, key: str, presented_token: int, stored_token: int) -> None:
        super().__init__(
            f"fenced out on {key}: presented token {presented_token} < stored fence {stored_token}"
        )
        self.key = key
        self.presented_token = presented_token
        self.stored_token = stored_token


class InvalidGrant(PaydbError):
    """A fenced write presented no grant, or one the lock service did not sign for this write.

    Distinct from FencedOut: a genuine but stale token is FencedOut; this one is not a token
    the lock service issued for the account at all. `reason` is lockservice.verifiers.grants' code.
    """

    code = "invalid_grant"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidOperatorAssertion(PaydbError):
    """A break-glass command (abandon) came without the lock service's operator assertion for
    it, or with one that is forged, expired, or for another payout or action. Nothing changed.
    `reason` is lockservice.verifiers.assertions' code."""

    code = "invalid_operator_assertion"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidTransition(PaydbError):
    code = "invalid_transition"


class UnknownAccount(PaydbError):
    code = "unknown_account"


class UnknownPayout(PaydbError):
    code = "unknown_payout"


class AlreadyExists(PaydbError):
    code = "already_exists"


class DuplicatePayout(AlreadyExists):
    code = "duplicate_payout"


class DuplicateAccount(AlreadyExists):
    code = "duplicate_account"


class InvalidInput(PaydbError):
    code = "invalid_input"


class InvalidAmount(InvalidInput):
    code = "invalid_amount"


class InvalidIdentifier(InvalidInput):
    code = "invalid_identifier"


class InvalidToken(InvalidInput):
    code = "invalid_token"


class UnknownState(InvalidInput):
    code = "unknown_state"
