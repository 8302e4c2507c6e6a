"""The rail stub's public client for readers of its movement log: the reconciler and the checker.

The movement log (`GET /admin/movements`) is the rail's own record of every instruction it
received, and so the evidence of money moving (or moving twice). Its readers import this module,
never the stub's app, so that they depend on the stub's API and not on how it is built.
Must never: write to the stub, or read anything but the movement log.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from common.credentials import auth_headers

__all__ = [
    "MONEY_MOVED",
    "MovementLogUnavailable",
    "MovementSource",
    "RailMovement",
    "RailstubClientError",
    "stub_movement_source",
]

#: Rail movement statuses under which money moved (or will, for `pending`).
MONEY_MOVED = frozenset({"settled", "pending"})


@dataclass(frozen=True, slots=True)
class RailMovement:
    """One instruction the rail recorded (its movement log is the evidence of money moving)."""

    movement_id: str
    client_reference: str
    amount: int
    status: str  # settled, pending, declined
    recorded_at: datetime | None = None  # None when the rail does not say (the stub does not)


#: The rail's movement log, injected: the stub's admin endpoint in tests, the demo and dev.
MovementSource = Callable[[], Awaitable[Sequence[RailMovement]]]


class RailstubClientError(Exception):
    """Base of this client's errors. `code` is a stable machine-readable name."""

    code = "railstub_client_error"


class MovementLogUnavailable(RailstubClientError):
    """The movement log could not be read (unreachable, refused, or not the stub's shape)."""

    code = "movement_log_unavailable"


def stub_movement_source(
    base_url: str,
    *,
    timeout_s: float = 10.0,
    token: str | None = None,
    verify: ssl.SSLContext | bool = True,
) -> MovementSource:
    """The rail stub's movement log (`GET /admin/movements`), read-only, presenting `token` (the
    reader's own credential: component `reconciler` or `invariants`, or an operator's)."""

    async def fetch() -> Sequence[RailMovement]:
        try:
            async with httpx.AsyncClient(
                base_url=base_url, timeout=timeout_s, headers=auth_headers(token), verify=verify
            ) as client:
                response = await client.get("/admin/movements")
                response.raise_for_status()
                body: dict[str, Any] = response.json()
            return [_movement(m) for m in body["movements"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise MovementLogUnavailable(f"rail movement log unavailable: {exc}") from exc

    return fetch


def _movement(m: dict[str, Any]) -> RailMovement:
    recorded = m.get("recorded_at")
    return RailMovement(
        movement_id=str(m["movement_id"]),
        client_reference=str(m["client_reference"]),
        amount=int(m["amount"]),
        status=str(m["status"]),
        recorded_at=datetime.fromisoformat(recorded) if recorded else None,
    )
