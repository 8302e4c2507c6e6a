"""One key's turn in this process: an acquire of a key waits here, not on the server, while
another acquire or an orphan reaper of that key runs (FIFO).

Why: it keeps the lock server's waiters few, and it lets a reaper (lockservice.sdk.releases)
know that no acquire of the key is in flight while it holds the key's turn, so the grant it
finds is nobody's. Must never: stand in for the server's grant (it is exclusion within one
process only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lockservice.sdk.lease import NotAcquiredError


@dataclass
class _Turn:
    """One key's exclusive turn in this process, and how many are using or waiting for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class KeyTurns:
    """The turns of every key in use in this process."""

    def __init__(self) -> None:
        self._turns: dict[str, _Turn] = {}

    @contextlib.asynccontextmanager
    async def turn(self, key: str, wait_s: float | None) -> AsyncIterator[None]:
        """Exclusive use of `key` in this process (FIFO); NotAcquiredError after `wait_s`."""
        turn = self._turns.setdefault(key, _Turn())
        turn.users += 1
        try:
            try:
                if wait_s is None or turn.users == 1:
                    await turn.lock.acquire()  # nobody else: at once (wait_for(.., 0) would not)
                elif wait_s > 0:
                    await asyncio.wait_for(turn.lock.acquire(), wait_s)
                else:
                    raise TimeoutError
            except TimeoutError:
                raise NotAcquiredError(key, "timeout") from None
            try:
                yield
            finally:
                turn.lock.release()
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[key]
