"""The SDK's background releases (`lockservice.client`): grants the server may hold for this
process's session although no caller will ever release them.

Owns: the orphan reapers (an acquire whose answer was lost, a release whose outcome is unknown)
and the count of orphans they released. Must never: release a grant a caller holds, or any
grant but this session's own (every release is the server's compare-and-delete on
(key, session, token)).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from common.logs import get_logger
from lockservice import api
from lockservice.api import Grant, LockError

if TYPE_CHECKING:
    from lockservice.client import LockClient

_log = get_logger("lockservice.client")


class BackgroundReleases:
    """The reapers of one `LockClient` (composition: the client owns one and delegates)."""

    def __init__(self, client: LockClient) -> None:
        self._client = client
        self._reapers: set[asyncio.Task[None]] = set()
        self.orphans_released = 0  # for tests and diagnostics

    @property
    def reaping(self) -> int:
        """Reapers still running (for tests and diagnostics)."""
        return len(self._reapers)

    def tasks(self) -> set[asyncio.Task[None]]:
        """Every background task still running (the client cancels them when it closes)."""
        return set(self._reapers)

    def reap_later(self, key: str, delay_s: float) -> None:
        task = asyncio.create_task(self._reap(key, delay_s), name=f"lock-reap:{key}")
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def _reap(self, key: str, delay_s: float) -> None:
        """Release a grant the server holds for this session that no caller knows about.

        Why this exists: the session is process-wide and kept alive by the heartbeat, so a grant
        nobody will release never expires, and the account's payouts would wait forever (seen
        in load runs). One appears when an acquire's answer is lost after the server granted it
        (a timeout, a reset connection, a lock-server restart, a cancelled caller; the server
        may even grant after the client gave up, until its own wait ends), or when a release's
        outcome is unknown. So the reaper first waits out the failed request's server-side
        wait (`delay_s`), then takes the key's turn, so no acquire of the key is in flight in
        this process, and releases a grant whose holder is this session under a token no caller
        holds. Safety never depends on this: a grant no caller holds protects nothing, and the
        release is the server's compare-and-delete on (key, session, token).
        """
        c = self._client
        await c._sleep(delay_s)
        async with c._turn(key, None):
            await self._release_orphan(key)

    async def _release_orphan(self, key: str) -> None:
        c = self._client
        for attempt in range(c.attempts):
            if attempt:
                await c._sleep(c._backoff(attempt))
            sid = c.session_id
            if sid is None:
                return  # no session: its grants ended with it
            try:
                info = await c._request("GET", f"/v1/locks?key={quote(key)}", attempts=1)
            except LockError:
                continue
            token = info.get("token")
            if info.get("holder_session") != sid or token is None:
                return
            if c._issued.get(key) == token:
                return  # a caller holds it
            body = grant_body(grant_of({**info, "session_id": sid}))
            try:
                await c._request("POST", "/v1/locks/release", json=body, attempts=1)
            except api.NotHeld:
                return
            except LockError:
                continue
            self.orphans_released += 1
            _log.warning("lock.orphan_released", key=key, token=token, session_id=sid)
            return


def grant_of(data: dict[str, Any]) -> Grant:
    """A grant from the server's JSON answer (acquire, renew, inspect + the session id)."""
    return Grant(
        key=str(data["key"]),
        token=int(data["token"]),
        session_id=str(data["session_id"]),
        acquired_at=datetime.fromisoformat(str(data["acquired_at"])),
        expires_at=datetime.fromisoformat(str(data["expires_at"])),
    )


def grant_body(g: Grant) -> dict[str, Any]:
    """A grant as the renew and release routes take it."""
    return {
        "key": g.key,
        "token": g.token,
        "session_id": g.session_id,
        "acquired_at": g.acquired_at.isoformat(),
        "expires_at": g.expires_at.isoformat(),
    }
