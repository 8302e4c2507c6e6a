"""Request and response models of the rail proxy's HTTP contract (contract rail-submit/1)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, Field

# Identifiers are URL-path safe (they appear in /v1/payouts/{payout_id}/attempts) and never carry
# spaces, control characters or NUL bytes.
IDENT = r"^[A-Za-z0-9._:@+=~-]+$"
MAX_BIGINT = 2**63 - 1


class HandoffCertainty(enum.StrEnum):
    """STD01-06: how sure we are about whether the instruction reached the rail."""

    NOT_SUBMITTED = "NOT_SUBMITTED"
    SUBMITTED = "SUBMITTED"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    FINAL = "FINAL"
    UNKNOWN = "UNKNOWN"


class Outcome(enum.StrEnum):
    """The recorded outcome of an attempt (FR-20); NULL in the database while in flight."""

    ACKED = "ACKED"
    DECLINED = "DECLINED"
    UNKNOWN = "UNKNOWN"
    NOT_SUBMITTED = "NOT_SUBMITTED"


CERTAINTY_OF = {
    Outcome.ACKED: HandoffCertainty.ACKNOWLEDGED,
    Outcome.DECLINED: HandoffCertainty.FINAL,
    Outcome.UNKNOWN: HandoffCertainty.UNKNOWN,
    Outcome.NOT_SUBMITTED: HandoffCertainty.NOT_SUBMITTED,
}


class SubmitContext(BaseModel):
    correlation_id: str = Field(min_length=1, max_length=128, pattern=IDENT)
    causation_id: str = Field(min_length=1, max_length=128, pattern=IDENT)
    deadline_at: AwareDatetime  # absolute: the proxy never starts a budget of its own


class GrantIn(BaseModel):
    """The lock service's signed grant, as its SDK received it (lockservice.verifiers.grants)."""

    key: str = Field(min_length=1, max_length=256)
    token: int = Field(ge=0, le=MAX_BIGINT)
    session_id: str = Field(min_length=1, max_length=128)
    expires_at: AwareDatetime
    kid: str = Field(min_length=1, max_length=64)
    signature: str = Field(min_length=1, max_length=200)


class SubmitRequest(BaseModel):
    payout_id: str = Field(min_length=1, max_length=128, pattern=IDENT)
    account_id: str = Field(min_length=1, max_length=128, pattern=IDENT)
    amount: int = Field(gt=0, le=10**15, description="integer minor units")
    client_reference: str = Field(min_length=1, max_length=128, pattern=IDENT)
    token: int = Field(ge=0, le=MAX_BIGINT, description="fencing token of the caller's grant")
    context: SubmitContext
    #: Verified before anything else; a missing one is refused as INVALID_GRANT (not 422), so
    #: the refusal says what is wrong.
    grant: GrantIn | None = None


class SubmitResponse(BaseModel):
    """200 (ACKED, DECLINED) or 202 (UNKNOWN): the attempt was recorded and forwarded."""

    payout_id: str
    attempt_id: int
    outcome: Outcome
    handoff_certainty: HandoffCertainty
    rail_status: Literal["settled", "pending", "declined"] | None = None
    rail_movement_id: str | None = None
    error_class: str | None = None
    token: int
    adapter_version: str
    contract_version: str


class ErrorBody(BaseModel):
    """Every rejection: nothing was forwarded unless handoff_certainty says otherwise."""

    code: str
    message: str
    handoff_certainty: HandoffCertainty
    presented_token: int | None = None
    highest_token: int | None = None


class AttemptRecord(BaseModel):
    attempt_id: int
    payout_id: str
    account_id: str
    amount: int
    client_reference: str
    token: int
    correlation_id: str
    causation_id: str
    deadline_at: datetime
    adapter_version: str
    contract_version: str
    connection_id: str
    #: The replica that recorded and forwarded it (None: recorded before replica ids existed).
    replica_id: str | None = None
    fencing_enforced: bool
    guard_bypassed: bool
    outcome: Outcome | None  # None = in flight or the outcome write was lost: treat as UNKNOWN
    rail_status: str | None
    rail_movement_id: str | None
    error_class: str | None
    recorded_at: datetime
    completed_at: datetime | None


class AttemptsResponse(BaseModel):
    payout_id: str
    attempts: list[AttemptRecord]


class LookupResponse(BaseModel):
    client_reference: str
    status: Literal["settled", "pending", "declined", "not_found"]
    observed_at: datetime
    # Passed through from the rail, on the rail's clock: its view is complete for submissions
    # received from `complete_from` until `complete_through`.
    complete_through: datetime | None = None
    complete_from: datetime | None = None
    # The proxy's judgement (docs/rail.md "When is a payout absent?"): True only when the rail's
    # window covers every recorded attempt of the reference with the Connection's margins.
    absent: bool = False
    reason: str = ""
