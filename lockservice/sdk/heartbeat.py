"""The SDK's two background loops per session: the heartbeat that keeps it alive (FR-11) and the
watchdog that fires the lock-lost signal as soon as the local deadline passes (FR-12).

Must never: treat a failed heartbeat as proof of loss (it retries soon; the deadline decides), or
let a passed deadline go unsignalled while leases are held. Safety still comes from the resources
checking the token; these loops only make a stale holder give up early.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from common.logs import get_logger
from lockservice.api import LockError
from lockservice.sdk.calls import BoundedCalls

_log = get_logger("lockservice.client")


class Heartbeating(Protocol):
    """What the two loops read and call on their client (`LockClient`): its session, local
    deadline, clock and keepalive. A Protocol, so that this module need not import the client
    that imports it."""

    @property
    def session_id(self) -> str | None: ...
    @property
    def deadline(self) -> float: ...
    @property
    def heartbeat_s(self) -> float: ...
    @property
    def leases_held(self) -> int: ...
    @property
    def calls(self) -> BoundedCalls: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def sleep(self) -> Callable[[float], Awaitable[None]]: ...
    async def keepalive_once(self) -> bool: ...
    def session_lost(self, reason: str) -> None: ...


async def heartbeat_loop(client: Heartbeating) -> None:
    """Keeps the session alive every `heartbeat_s`, sooner after a failed keepalive (FR-11)."""
    delay = client.heartbeat_s
    while True:
        await client.sleep(delay)
        if client.session_id is None:
            continue  # nothing to keep alive: the next acquire opens a new session
        try:
            ok = await client.keepalive_once()
            delay = client.heartbeat_s
            if not ok:
                _log.warning("lock.session_expired", session_id=client.session_id)
        except LockError as exc:
            # Not proof of loss: retry soon; the deadline fires the lost signal if it lasts.
            delay = min(client.heartbeat_s, client.calls.backoff(1))
            _log.warning(
                "lock.heartbeat_failed",
                error=exc.code,
                why=str(exc)[:200] or type(exc).__name__,
                session_id=client.session_id,
                seconds_to_deadline=round(client.deadline - client.clock(), 3),
            )


async def watchdog_loop(client: Heartbeating) -> None:
    """Fires the lost signal as soon as the local deadline passes (FR-12)."""
    while True:
        remaining = client.deadline - client.clock()
        if remaining <= 0:
            if client.leases_held:
                client.session_lost("deadline")
            remaining = client.heartbeat_s / 4  # re-check after the next heartbeat chance
        await client.sleep(remaining)
