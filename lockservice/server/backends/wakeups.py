"""Which of this process's blocked acquirers of a key a NOTIFY for that key wakes (issue 29, the
hand-off between consecutive holders of a hot account).

Owns: the waiters of each key in arrival order and the wake-up rule. One NOTIFY means one
release (or revoke, close, epoch bump): at most one waiter can be granted the key, so it wakes
ONE waiter, the longest-waiting one not already awake, instead of all of them (every woken
waiter runs `acquire_grant`; all but one found the key taken again and went back to sleep,
competing with the winner for the database and this process's event loop on the way). A waiter
that leaves without a grant after a wake-up it may have used up (woken, then cancelled, failed,
or out of time) hands one on, so a free key never waits with every waiter asleep.

Must never: decide who is granted the key (the database does, `acquire_grant`), or wake fewer
waiters than one per NOTIFY while any waits. What still bounds a lost wake-up is the backend's:
the holder's expiry and the wait cap (`postgres._WAIT_CAP_S`).
"""

from __future__ import annotations

import asyncio

__all__ = ["Wakeups"]


class Wakeups:
    """The blocked acquirers of each key in this process, oldest first."""

    def __init__(self, *, wake_all: bool = False) -> None:
        # A dict per key, used as an ordered set: arrival order is the wake-up order.
        self._waiting: dict[str, dict[asyncio.Event, None]] = {}
        # The A/B's other side only (LOCK_PG_WAKE=all, docs/performance.md): every waiter.
        self._wake_all = wake_all

    def join(self, key: str) -> asyncio.Event:
        """A new waiter of `key`: the event it sleeps on."""
        event = asyncio.Event()
        self._waiting.setdefault(key, {})[event] = None
        return event

    def notify(self, key: str) -> None:
        """A NOTIFY for `key`: wake the longest-waiting waiter that is not awake already. When
        every one is awake, each will attempt after this NOTIFY anyway (an awake waiter attempts
        next; one in the middle of an attempt cleared its event first, so it is woken again)."""
        for event in self._waiting.get(key, ()):
            if not event.is_set():
                event.set()
                if not self._wake_all:
                    return

    def leave(self, key: str, event: asyncio.Event, *, hand_on: bool) -> None:
        """The waiter of `event` stops waiting; `hand_on`: it leaves without a grant after a
        wake-up it may have used up, which then goes to the next waiter."""
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        waiting.pop(event, None)
        if not waiting:
            del self._waiting[key]
        elif hand_on:
            self.notify(key)

    def count(self, key: str) -> int:
        """How many of this process's acquirers wait for `key`."""
        return len(self._waiting.get(key, ()))
