"""Values returned by the store, and the input checks that run before anything is written."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from ledger.errors import InvalidAmount, InvalidIdentifier, InvalidToken
from ledger.states import PayoutState

BIGINT_MAX = (1 << 63) - 1
_ACCOUNT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_PAYOUT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
MAX_TEXT = 1000


@dataclass(frozen=True, slots=True)
class Payout:
    payout_id: str
    account_id: str
    amount: int
    state: PayoutState
    fence: int
    client_reference: str
    failure_reason: str | None
    ledger_group_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Payout:
        return cls(
            payout_id=row["payout_id"],
            account_id=row["account_id"],
            amount=row["amount"],
            state=PayoutState(row["state"]),
            fence=row["fence"],
            client_reference=row["client_reference"],
            failure_reason=row["failure_reason"],
            ledger_group_id=row["ledger_group_id"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class AlreadyAdvanced:
    """Not an error (UC-01 alternate (a)): another holder already moved the payout past the
    expected from-state. Nothing of the payout was written (a claim still stamped its account's
    fence, `ledger.store.steps`); the caller releases or recovers and moves on."""

    payout_id: str
    state: PayoutState
    fence: int


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One row of `paydb.audit_log` (append-only); `details` as its JSON text."""

    audit_id: int
    at: datetime
    actor: str
    token: int | None
    action: str
    payout_id: str | None
    account_id: str | None
    from_state: str | None
    to_state: str | None
    details: str

    @classmethod
    def from_row(cls, row: Any) -> AuditRow:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


PAYOUT_COLUMNS = (
    "payout_id, account_id, amount, state, fence, client_reference, failure_reason,"
    " ledger_group_id, created_at, updated_at"
)


def check_account_id(value: object) -> str:
    if not isinstance(value, str) or not _ACCOUNT_ID.match(value):
        raise InvalidIdentifier(f"account id must match {_ACCOUNT_ID.pattern}: {value!r}")
    return value


def check_payout_id(value: object) -> str:
    if not isinstance(value, str) or not _PAYOUT_ID.match(value):
        raise InvalidIdentifier(f"payout id must match {_PAYOUT_ID.pattern}: {value!r}")
    return value


def check_amount(value: object) -> int:
    # bool is an int subclass; True must not become a one-cent payout.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidAmount(f"amount must be an integer number of minor units: {value!r}")
    if not 0 < value <= BIGINT_MAX:
        raise InvalidAmount(f"amount must be in 1..{BIGINT_MAX} minor units: {value}")
    return value


def check_token(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= BIGINT_MAX:
        raise InvalidToken(f"token must be an integer in 1..{BIGINT_MAX}: {value!r}")
    return value


def check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
        raise InvalidIdentifier(f"{what} must be a non-empty string of at most {MAX_TEXT} chars")
    return value
