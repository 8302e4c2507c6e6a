"""The stub's in-memory movement log: what reached the rail, and what a lookup may see of it."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

Status = Literal["settled", "pending", "declined"]
LookupStatus = Literal["settled", "pending", "declined", "not_found"]


@dataclass
class Movement:
    """One instruction the rail accepted. Declined ones are kept (the lookup must report them)."""

    client_reference: str
    account_id: str
    amount: int
    declined: bool
    recorded_at: float  # monotonic seconds
    settles_at: float  # monotonic seconds; == recorded_at for an immediate settlement
    movement_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    recorded_wall: datetime = field(default_factory=lambda: datetime.now(UTC))  # for windows

    def status(self, now: float) -> Status:
        if self.declined:
            return "declined"
        return "settled" if now >= self.settles_at else "pending"


class MovementLog:
    """Append-only log. Non-idempotent on purpose: the same reference twice is two movements."""

    def __init__(self) -> None:
        self._movements: list[Movement] = []
        self.lookups = 0

    def record(
        self,
        *,
        client_reference: str,
        account_id: str,
        amount: int,
        declined: bool,
        completion_delay_s: float = 0.0,
    ) -> Movement:
        now = time.monotonic()
        movement = Movement(
            client_reference=client_reference,
            account_id=account_id,
            amount=amount,
            declined=declined,
            recorded_at=now,
            settles_at=now + completion_delay_s,
        )
        self._movements.append(movement)
        return movement

    def lookup(self, client_reference: str, visibility_delay_s: float) -> LookupStatus:
        """Read-only and eventually consistent (A-08): recent movements are not yet visible."""
        self.lookups += 1
        now = time.monotonic()
        seen = [
            m.status(now)
            for m in self._movements
            if m.client_reference == client_reference and now >= m.recorded_at + visibility_delay_s
        ]
        order: tuple[Status, ...] = ("settled", "pending", "declined")
        return next((status for status in order if status in seen), "not_found")

    def snapshot(self, client_reference: str | None = None) -> list[dict[str, object]]:
        now = time.monotonic()
        return [
            {
                "movement_id": m.movement_id,
                "client_reference": m.client_reference,
                "account_id": m.account_id,
                "amount": m.amount,
                "status": m.status(now),
                "recorded_at": m.recorded_wall.isoformat(),
            }
            for m in self._movements
            if client_reference is None or m.client_reference == client_reference
        ]

    def counts(self) -> dict[str, int]:
        """Instructions recorded per client reference (declined included): > 1 is a duplicate."""
        return dict(Counter(m.client_reference for m in self._movements))

    def clear(self) -> None:
        self._movements.clear()
        self.lookups = 0
