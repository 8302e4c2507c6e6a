"""The event context every store method takes (STD01-04, events and notifications).

It lands in the audit row (actor, FR-30) and the outbox row (correlation and causation ids).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkContext:
    correlation_id: str  # ties the end-to-end business interaction together (e.g. the payout id)
    actor: str  # who acts: a worker identity, or an operator for break-glass actions
    causation_id: str | None = None  # the command/event/task that directly caused this work
