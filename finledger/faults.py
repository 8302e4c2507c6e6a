"""Injectable behaviour of the finance ledger and the pure decision for one write request."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, Field, model_validator


class Action(enum.StrEnum):
    """What the ledger does with one write."""

    ACCEPT = "accept"  # normal processing: created / duplicate / conflict / unknown account
    FAIL = "fail"  # answers `status` (503 by default) and records nothing
    DROP = "drop"  # closes the connection without an answer, records nothing
    DROP_AFTER_RECORD = "drop_after_record"  # records, then closes without an answer


class Rule(BaseModel):
    """A deterministic per-request behaviour; the first matching rule with uses left wins."""

    correlation_prefix: str | None = Field(default=None, min_length=1, max_length=256)
    account_id: str | None = Field(default=None, min_length=1, max_length=128)
    action: Action = Action.ACCEPT
    status: int = Field(default=503, ge=400, le=599)
    latency_s: float | None = Field(default=None, ge=0, le=600)
    #: How many matching requests this rule applies to; None = every one.
    times: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _needs_a_match(self) -> Self:
        if self.correlation_prefix is None and self.account_id is None:
            raise ValueError("a rule needs correlation_prefix or account_id")
        return self

    def matches(self, correlation_id: str, account_id: str) -> bool:
        if self.correlation_prefix is not None and not correlation_id.startswith(
            self.correlation_prefix
        ):
            return False
        return self.account_id is None or account_id == self.account_id


class Faults(BaseModel):
    """The ledger's current behaviour; `PUT /admin/faults` replaces it as a whole."""

    #: Latency of every write unless a rule sets its own.
    latency_s: float = Field(default=0.0, ge=0, le=600)
    #: Outage: every write answers 503 and records nothing.
    down: bool = False
    #: Accounts absent from finance's chart of accounts (prefix match): writes answer 404.
    unknown_account_prefixes: list[str] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)


@dataclass(frozen=True)
class Decision:
    action: Action
    status: int
    latency_s: float


def decide(faults: Faults, uses: list[int], correlation_id: str, account_id: str) -> Decision:
    """The decision for one write. `uses[i]` counts how often rule i fired (mutated here)."""
    for i, rule in enumerate(faults.rules):
        if rule.times is not None and uses[i] >= rule.times:
            continue
        if rule.matches(correlation_id, account_id):
            uses[i] += 1
            latency = faults.latency_s if rule.latency_s is None else rule.latency_s
            return Decision(rule.action, rule.status, latency)
    if faults.down:
        return Decision(Action.FAIL, 503, faults.latency_s)
    return Decision(Action.ACCEPT, 0, faults.latency_s)


def is_unknown_account(faults: Faults, account_id: str) -> bool:
    return any(account_id.startswith(p) for p in faults.unknown_account_prefixes)
