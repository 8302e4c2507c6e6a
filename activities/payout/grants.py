"""The grants this worker process holds, one per (lock key, token), and what its holder steps
do with them: check one is still held, present its signed grant, mark it in use while a step
runs under it, give it back, and sweep those no step has used for a while.

One `HeldGrants` per process, shared by the lock steps (which add and hand over grants) and the
critical-section steps (which use and release them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from activities import models as m
from activities.payout.support import log, lost_error, reporting_progress
from common import correlation
from common.lockkey import lock_key
from lockservice.api import LockError, NotHeld
from lockservice.sdk import Lease, LockClient
from lockservice.verifiers import SignedGrant

__all__ = ["HeldGrants"]


@dataclass
class _HeldGrant:
    """A grant this process holds, and how the critical-section steps are using it."""

    lease: Lease
    active: int = 0  # steps running under it now
    idle_since: float = field(default_factory=time.monotonic)


class HeldGrants:
    """This process's grants, by (lock key, token): tokens are unique per key, not globally,
    and one process holds many accounts' grants."""

    def __init__(self, locks: LockClient) -> None:
        self._locks = locks
        self._held: dict[tuple[str, int], _HeldGrant] = {}

    def __len__(self) -> int:
        return len(self._held)

    def add(self, lease: Lease) -> None:
        """Register a grant just acquired: its steps find it here, and the sweeper watches it."""
        self._held[(lease.key, lease.token)] = _HeldGrant(lease)

    def steps_running(self, key: str, token: int) -> int:
        """How many steps run under this grant now (tests, diagnostics)."""
        return self._held[(key, token)].active

    def lease(self, req: m.StepRequest) -> Lease:
        """The lease for the step's token, still held by the local deadline; else LockLost.

        A liveness aid only (FR-13): the resource's fence check is what keeps a stale holder
        out, because this process can pause right after the check returns True.
        """
        held = self._held.get((lock_key(req.account_id), req.token))
        lease = held.lease if held is not None else None
        if lease is None or not lease.still_held():
            reason = "no such grant in this process" if lease is None else lease.lost_reason
            raise lost_error(req, str(reason))
        return lease

    def still_held(self, req: m.StepRequest) -> bool:
        """Whether the step's grant is still held, without raising (for logs only)."""
        held = self._held.get((lock_key(req.account_id), req.token))
        return held is not None and held.lease.still_held()

    async def signed_grant(self, req: m.StepRequest) -> SignedGrant | None:
        """The step's lease, still held, and its signed grant to present (renewed when its
        stated expiry is near); LockLost if the lease is gone or the renew is refused."""
        lease = self.lease(req)
        try:
            return await lease.signed_grant()
        except NotHeld as exc:
            raise lost_error(req, f"renew refused: {exc}") from exc

    async def release(self, req: m.StepRequest) -> None:
        """Give the step's grant back; never raises for the lock service's sake.

        This process's session lives on by its heartbeat, so a release the lock server did not
        answer would otherwise hold the account for as long as the process lives: the SDK
        keeps it pending and retries it until it succeeds or the session ends (issue 24 item 6,
        lockservice.sdk.releases). Safety never depends on it: the next grant has a higher token.
        """
        held = self._held.pop((lock_key(req.account_id), req.token), None)
        if held is None:
            return
        with (
            correlation.bound(req.context.correlation_id),
            contextlib.suppress(LockError, httpx.HTTPError),
        ):
            await self._locks.release(held.lease)

    async def give_back(self, lease: Lease) -> None:
        """Release a grant nobody received (its acquire's answer went nowhere), if still ours.
        A failure here is not the end of it: the SDK retries the release until it succeeds or
        the session ends (lockservice.sdk.releases)."""
        if self._held.pop((lease.key, lease.token), None) is None:
            return
        with contextlib.suppress(LockError, httpx.HTTPError):
            await self._locks.release(lease)

    @contextlib.asynccontextmanager
    async def holding(self, req: m.StepRequest) -> AsyncIterator[None]:
        """Marks the step's grant in use while the step runs (see `sweep_idle`), and heartbeats
        for the step's whole duration.

        Why every holder step heartbeats: the workflow gives critical-section steps a short
        heartbeat timeout, to notice a dead holder within seconds. A step that legitimately waits
        (post_to_ledger queued on the contended rail_clearing balance row's lock, a claim behind
        a slow database) must not look dead while it waits: it would be timed out, its grant
        abandoned and the work re-acquired and redone for nothing. The heartbeat says only "this
        process is alive"; start-to-close still bounds a step whose process lives but hangs.
        """
        held = self._held.get((lock_key(req.account_id), req.token))
        if held is not None:
            held.active += 1
        try:
            async with reporting_progress():
                yield
        finally:
            if held is not None:
                held.active -= 1
                held.idle_since = time.monotonic()

    async def sweep_idle(self, idle_s: float, every_s: float = 5.0) -> None:
        """Release grants this process holds that no step has used for `idle_s`; runs until
        cancelled (worker/process.py starts it).

        Why: a grant whose workflow moved on is never released by that workflow, and this
        process's session, kept alive by the heartbeat, would hold it forever, stopping every
        later payout of the account (seen in a 2,000-payout chaos run: an acquire activity that
        finished after Temporal had timed it out handed its lease to nobody). `idle_s` must be
        comfortably longer than the gap between two steps of one critical section, which on a
        saturated machine includes a workflow task's wait (see WORKER_LEASE_IDLE_S). Safety
        never depends on this: a step that comes later finds no grant (LOCK_LOST), and the
        resources fence whatever it would have done.
        """
        while True:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            for k, held in list(self._held.items()):
                if held.active or now - held.idle_since < idle_s:
                    continue
                if self._held.pop(k, None) is None:
                    continue  # released by its workflow while we released another one
                lease = held.lease
                log.warning(
                    "lock.idle_lease_released",
                    key=lease.key,
                    token=lease.token,
                    idle_s=round(now - held.idle_since, 1),
                )
                # Unanswered, it stays pending in the SDK until it succeeds or the session ends.
                with contextlib.suppress(LockError, httpx.HTTPError):
                    await self._locks.release(lease)
