"""Injectable behaviours of the stub and the pure decision of what happens to one submission."""

from __future__ import annotations

import enum
import math
import random
from typing import Self

from pydantic import BaseModel, Field, model_validator

# z-score of the 99th percentile of a standard normal: fits a lognormal to (p50, p99).
_Z99 = 2.3263478740408408


class Action(enum.StrEnum):
    """What the rail does with one submission."""

    SETTLE = "settle"  # recorded, settled, 200
    DECLINE = "decline"  # recorded as declined (business rejection), 200, no money moves
    DELAYED = "delayed"  # recorded as pending, 202; settles after completion_delay_s
    TIMEOUT_BEFORE = "timeout_before"  # stalls and never records: nothing happened at the rail
    TIMEOUT_AFTER = "timeout_after"  # recorded (money moves), then stalls with no response
    AMBIGUOUS = "ambiguous"  # recorded (money moves), then answers 500
    UNAVAILABLE = "unavailable"  # 503 NOT_ACCEPTED, nothing recorded


class Rule(BaseModel):
    """A deterministic per-request behaviour; the first matching rule wins over random choices."""

    amount_suffix: str | None = Field(default=None, pattern=r"^[0-9]{1,12}$")
    reference_prefix: str | None = Field(default=None, min_length=1, max_length=128)
    action: Action | None = None  # None keeps the random choice (e.g. a latency-only rule)
    latency_ms: int | None = Field(default=None, ge=0, le=600_000)

    @model_validator(mode="after")
    def _needs_a_match(self) -> Self:
        if self.amount_suffix is None and self.reference_prefix is None:
            raise ValueError("a rule needs amount_suffix or reference_prefix")
        return self

    def matches(self, amount: int, client_reference: str) -> bool:
        if self.amount_suffix is not None and not str(amount).endswith(self.amount_suffix):
            return False
        return self.reference_prefix is None or client_reference.startswith(self.reference_prefix)


class Behaviour(BaseModel):
    """The stub's current behaviour; `POST /admin/behaviour` replaces the fields it names."""

    latency_mode: str = Field(default="lognormal", pattern="^(lognormal|fixed)$")
    latency_fixed_ms: int = Field(default=0, ge=0, le=600_000)
    latency_p50_ms: float = Field(default=300.0, gt=0)
    latency_p99_ms: float = Field(default=3000.0, gt=0)
    ambiguity_rate: float = Field(default=0.005, ge=0, le=1)
    decline_rate: float = Field(default=0.0, ge=0, le=1)
    delayed_rate: float = Field(default=0.0, ge=0, le=1)
    #: Provider outage: every call (submit, lookup, health) answers 503 and records nothing.
    outage: bool = False
    completion_delay_s: float = Field(default=2.0, ge=0)
    #: A-08: a recorded movement becomes visible to lookup only after this delay.
    visibility_delay_s: float = Field(default=0.0, ge=0)
    #: How long a timeout behaviour stalls before answering 504 (admin reset releases it).
    stall_s: float = Field(default=60.0, ge=0)
    #: How far the rail's clock is off (seconds, + = ahead): every wall-clock time the stub
    #: reports (complete_through, complete_from, recorded_at) is shifted by it.
    clock_skew_s: float = Field(default=0.0, ge=-3600, le=3600)
    rules: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _p99_above_p50(self) -> Self:
        if self.latency_p99_ms < self.latency_p50_ms:
            raise ValueError("latency_p99_ms must be >= latency_p50_ms")
        return self


def decide(
    behaviour: Behaviour, rng: random.Random, amount: int, client_reference: str
) -> tuple[Action, float]:
    """The action and the latency (seconds) for one submission; random draws use `rng` only."""
    rule = next((r for r in behaviour.rules if r.matches(amount, client_reference)), None)
    latency_s = _latency(behaviour, rng)
    if rule is not None and rule.latency_ms is not None:
        latency_s = rule.latency_ms / 1000
    if behaviour.outage:
        return Action.UNAVAILABLE, latency_s
    if rule is not None and rule.action is not None:
        return rule.action, latency_s
    draw = rng.random()
    for action, rate in (
        (Action.AMBIGUOUS, behaviour.ambiguity_rate),
        (Action.DECLINE, behaviour.decline_rate),
        (Action.DELAYED, behaviour.delayed_rate),
    ):
        if draw < rate:
            return action, latency_s
        draw -= rate
    return Action.SETTLE, latency_s


def _latency(behaviour: Behaviour, rng: random.Random) -> float:
    if behaviour.latency_mode == "fixed":
        return behaviour.latency_fixed_ms / 1000
    mu = math.log(behaviour.latency_p50_ms / 1000)
    sigma = math.log(behaviour.latency_p99_ms / behaviour.latency_p50_ms) / _Z99
    return rng.lognormvariate(mu, sigma)
