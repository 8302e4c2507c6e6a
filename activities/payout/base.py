"""The state every payout activity shares (one instance per worker process) and the helpers
of the fenced steps: the grant held, the fenced write, the experiments' crash point.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.support import (
    _PROGRESS,
    GrantArg,
    _fenced,
    _heartbeating,
    _HeldGrant,
    _latest_live_attempt,
    _lost,
    log,
)
from common import correlation
from common.credentials import auth_headers
from common.lockkey import lock_key
from ledger import AlreadyAdvanced, FencedOut, Payout, PayoutStore, UnknownPayout
from ledger import WorkContext as LedgerContext
from ledger.errors import InvalidGrant, InvalidTransition
from lockservice.api import LockError, NotHeld
from lockservice.client import Lease, LockClient
from lockservice.grants import SignedGrant
from railproxy.client import RailProxyClient
from railproxy.models import AttemptRecord

if TYPE_CHECKING:
    from activities.payout_activities import PayoutActivities


@contextlib.contextmanager
def store_refusals(req: m.StepRequest) -> Iterator[None]:
    """The payment store's refusals of a fenced write, as the activity errors the workflow acts
    on; every one is non-retryable, so no refused write is ever repeated under the same token."""
    try:
        yield
    except FencedOut as exc:
        raise _fenced(exc) from exc
    except InvalidGrant as exc:
        # Our own grant refused (expired by its statement, a key this store does not accept):
        # writing under it is over; the workflow re-acquires, as for a lost lock.
        raise _lost(req, f"payment database refused the grant: {exc.reason}") from exc
    except InvalidTransition as exc:
        raise ApplicationError(str(exc), type=m.INVALID_TRANSITION, non_retryable=True) from exc


class PayoutActivitiesBase:
    """Constructor and shared helpers of PayoutActivities (`activities.payout_activities`)."""

    def __init__(
        self,
        *,
        locks: LockClient,
        store: PayoutStore,
        proxy: RailProxyClient,
        worker_queue: str,
        worker_id: str,
        lock_url: str,
        token: str | None = None,
        verify: ssl.SSLContext | bool = True,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        pause_before_submit: bool = False,
        crash_at: str = "",
        temporal: Client | None = None,
    ) -> None:
        self._locks = locks
        self._store = store
        self._proxy = proxy
        self._worker_queue = worker_queue
        self._worker_id = worker_id
        # Break-glass revokes go to the lock server's HTTP API with the worker's bearer credential
        # (common.credentials): one client for this instance's lifetime (`aclose`), not one a call.
        self._lock_http = httpx.AsyncClient(
            base_url=lock_url, timeout=10.0, headers=auth_headers(token), verify=verify
        )
        self._now = now
        # Tokens are unique per key, not globally: one process holds many accounts' grants.
        self._leases: dict[tuple[str, int], _HeldGrant] = {}
        # The Temporal client that hands acquired grants over (see `_hand_over`); None: the
        # SDK completes the acquire activity, and an undelivered grant waits for the sweeper.
        self._temporal = temporal
        self._handovers: set[asyncio.Task[None]] = set()
        # UC-03 experiment only: freeze this process (a real SIGSTOP, like a stop-the-world GC)
        # once, between the still_held() check and the rail call: the check-then-act gap.
        self._pause_before_submit = pause_before_submit
        # UC-04 experiment only: SIGKILL this process right after a write reaches this state.
        self._crash_at = crash_at
        if pause_before_submit:
            log.warning(
                "experiment.pause_armed",
                worker_id=worker_id,
                detail="this worker will SIGSTOP itself before its first submit",
            )

    # ------------------------------------------------------------------ helpers

    def _ctx(self, c: m.WorkContext, actor: str | None = None) -> LedgerContext:
        return LedgerContext(
            correlation_id=c.correlation_id,
            causation_id=c.causation_id or None,
            actor=actor or self._worker_id,
        )

    def _held(self, req: m.StepRequest) -> Lease:
        """The lease for the step's token, still held by the local deadline; else LockLost.

        A liveness aid only (FR-13): the resource's fence check is what keeps a stale holder
        out, because this process can pause right after the check returns True.
        """
        held = self._leases.get((lock_key(req.account_id), req.token))
        lease = held.lease if held is not None else None
        if lease is None or not lease.still_held():
            reason = "no such grant in this process" if lease is None else lease.lost_reason
            raise _lost(req, str(reason))
        return lease

    def _held_quietly(self, req: m.StepRequest) -> bool:
        held = self._leases.get((lock_key(req.account_id), req.token))
        return held is not None and held.lease.still_held()

    async def _current(self, payout_id: str) -> Payout:
        try:
            return await self._store.get_payout(payout_id)
        except UnknownPayout as exc:
            raise ApplicationError(str(exc), type=m.UNKNOWN_PAYOUT, non_retryable=True) from exc

    async def _grant(self, req: m.StepRequest) -> SignedGrant | None:
        """The step's lease, still held, and its signed grant to present (renewed when its
        stated expiry is near); LockLost if the lease is gone or the renew is refused."""
        lease = self._held(req)
        try:
            return await lease.signed_grant()
        except NotHeld as exc:
            raise _lost(req, f"renew refused: {exc}") from exc

    async def _write(
        self, req: m.StepRequest, write: Callable[[GrantArg], Awaitable[Payout | AlreadyAdvanced]]
    ) -> Payout:
        """Run one fenced write; FencedOut aborts the grant, AlreadyAdvanced re-reads."""
        grant = await self._grant(req)
        with store_refusals(req):
            result = await write(grant)
        if isinstance(result, AlreadyAdvanced):
            # UC-01 alternate (a): another holder moved it on. Not an error: re-read and go on.
            return await self._current(req.payout_id)
        assert isinstance(result, Payout)
        self._crash_if_armed(req, result)
        return result

    def _crash_if_armed(self, req: m.StepRequest, result: Payout) -> None:
        if self._crash_at and str(result.state) == self._crash_at:
            log.warning(
                "experiment.crashing",
                worker_id=self._worker_id,
                state=self._crash_at,
                payout_id=req.payout_id,
                token=req.token,
            )
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies after the commit, mid-payout

    async def _stamp_account_fence(self, req: m.StepRequest) -> None:
        """The fenced stamp of the account's balance row; FencedOut aborts the grant."""
        grant = await self._grant(req)
        try:
            await self._store.stamp_account_fence(req.payout_id, req.token, grant=grant)
        except FencedOut as exc:
            raise _fenced(exc) from exc
        except InvalidGrant as exc:
            raise _lost(req, f"payment database refused the grant: {exc.reason}") from exc

    async def _attempt(self, payout_id: str) -> AttemptRecord | None:
        return _latest_live_attempt(await self._proxy.get_attempts(payout_id))

    async def _release(self, req: m.StepRequest) -> None:
        """Give the step's grant back; never raises for the lock service's sake.

        This process's session lives on by its heartbeat, so a release the lock server did not
        answer would otherwise hold the account for as long as the process lives: the SDK
        keeps it pending and retries it until it succeeds or the session ends (issue 24 item 6,
        lockservice._releases). Safety never depends on it: the next grant has a higher token.
        """
        held = self._leases.pop((lock_key(req.account_id), req.token), None)
        if held is None:
            return
        with (
            correlation.bound(req.context.correlation_id),
            contextlib.suppress(LockError, httpx.HTTPError),
        ):
            await self._locks.release(held.lease)


#: A holder step, defined on one of the parts (`activities/payout/`) of PayoutActivities.
_Step = Callable[[Any, m.StepRequest], Awaitable[Any]]


def _holder_step(fn: _Step) -> _Step:
    """Marks the step's grant in use while the step runs (see `sweep_idle_leases`), and
    heartbeats for the step's whole duration.

    Why every step heartbeats: the workflow gives critical-section steps a short heartbeat
    timeout, to notice a dead holder within seconds. A step that legitimately waits (post_to_ledger
    queued on the contended rail_clearing balance row's lock, a claim behind a slow database)
    must not look dead while it waits: it would be timed out, its grant abandoned and the work
    re-acquired and redone for nothing. The heartbeat says only "this process is alive";
    start-to-close still bounds a step whose process lives but hangs.
    """

    @functools.wraps(fn)
    async def run(self: PayoutActivities, req: m.StepRequest) -> Any:
        held = self._leases.get((lock_key(req.account_id), req.token))
        if held is not None:
            held.active += 1
        details: list[dict[str, str]] = []
        reset = _PROGRESS.set(details)
        try:
            async with _heartbeating(details=details):
                return await fn(self, req)
        finally:
            _PROGRESS.reset(reset)
            if held is not None:
                held.active -= 1
                held.idle_since = time.monotonic()

    return run
