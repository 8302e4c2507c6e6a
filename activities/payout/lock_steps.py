"""Lock steps of a payout: acquire (and hand the grant over to its workflow) and release. The
idle-lease sweeper is `HeldGrants.sweep_idle`; the break-glass revokes are in `revokes.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities import models as m
from activities.payout.grants import HeldGrants
from activities.payout.support import heartbeating, log, past_start_to_close
from common import correlation
from common.lockkey import lock_key
from lockservice.api import LockError
from lockservice.sdk import Lease, LockClient, NotAcquiredError

__all__ = ["LockSteps"]

T = TypeVar("T")

#: Temporal's answers to a completion that say "try again", not "nobody is waiting for it".
_TRANSIENT = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.UNKNOWN,
        RPCStatusCode.INTERNAL,
        RPCStatusCode.CANCELLED,
    }
)


class LockSteps:
    """acquire_lock (shared queue) and release_lock (holder queue)."""

    def __init__(
        self,
        *,
        locks: LockClient,
        grants: HeldGrants,
        worker_queue: str,
        temporal: Client | None = None,
    ) -> None:
        self._locks = locks
        self._grants = grants
        self._worker_queue = worker_queue
        # The Temporal client that hands acquired grants over (see `_hand_over`); None: the
        # SDK completes the acquire activity, and an undelivered grant waits for the sweeper.
        self._temporal = temporal
        self._handovers: set[asyncio.Task[None]] = set()

    async def acquire_lock(self, req: m.AcquireRequest) -> m.AcquireResult:
        """UC-01 step 2. Bounded, jittered retries live in the SDK (FR-28); no grant, no work.
        The payout's correlation id goes with the request: the lock server's events carry it."""
        with correlation.bound(req.context.correlation_id):
            taken = await self.take_lease(req)
            if isinstance(taken, m.AcquireResult):
                return taken
            result = m.AcquireResult(
                acquired=True, token=taken.token, worker_queue=self._worker_queue
            )
            return self.deliver(taken, result, req.payout_id)

    async def take_lease(self, req: m.AcquireRequest) -> Lease | m.AcquireResult:
        """The account's grant, held by this process (registered for its steps and the idle
        sweeper), or why not (an AcquireResult with acquired=False)."""
        try:
            # Heartbeats while it waits on the lock server: the workflow gives this activity a
            # heartbeat timeout, so one taken by a frozen worker is retried elsewhere in seconds.
            async with heartbeating():
                lease = await self._locks.acquire(lock_key(req.account_id), req.wait_s)
        except NotAcquiredError as exc:
            return m.AcquireResult(acquired=False, reason=exc.reason)
        except (LockError, httpx.HTTPError) as exc:
            # Fail closed (UC-08): the payout is not executed; the workflow backs off.
            log.warning(
                "lock.acquire_unavailable",
                key=lock_key(req.account_id),
                payout_id=req.payout_id,
                error=str(exc),
            )
            return m.AcquireResult(acquired=False, reason="unavailable")
        if past_start_to_close(activity.info()):
            # Temporal has timed this activity out already, so this answer would go nowhere and
            # the grant with it: give it back now instead of leaving it to the idle sweeper.
            log.warning("lock.acquired_too_late", key=lease.key, token=lease.token)
            with contextlib.suppress(LockError, httpx.HTTPError):
                await self._locks.release(lease)
            return m.AcquireResult(acquired=False, reason="late")
        self._grants.add(lease)
        return lease

    def deliver(self, lease: Lease, result: T, payout_id: str) -> T:
        """Return `result` as this activity's answer; with a Temporal client, complete the
        activity from here instead (`_hand_over`), which learns whether the workflow got it."""
        if self._temporal is None:
            return result
        info = activity.info()
        handover = asyncio.create_task(self._hand_over(info, lease, result, payout_id))
        self._handovers.add(handover)
        handover.add_done_callback(self._handovers.discard)
        activity.raise_complete_async()

    @property
    def handovers(self) -> int:
        """Grants being handed over to their workflows right now (tests, diagnostics)."""
        return len(self._handovers)

    async def _hand_over(
        self, info: activity.Info, lease: Lease, result: object, payout_id: str
    ) -> None:
        """Complete the acquire activity from here, so that this process learns whether its
        workflow got the grant, and give the grant back at once when it did not.

        Why (issue 16): an acquire that completed at the lock server but whose result never
        reached the workflow (Temporal restarted or was unreachable, and the attempt timed out
        meanwhile) left a grant that this process's session, kept alive by its heartbeat, held
        until the idle sweeper ran (`WORKER_LEASE_IDLE_S`, 60 s), blocking the account; the
        workflow's next acquire waited all that time. Completed by the SDK, the loss is
        invisible here; completed by this call, Temporal answers: accepted (the workflow has the
        grant), or NOT_FOUND (the attempt timed out, or the workflow is gone: nobody has it).
        While Temporal is unreachable the call is retried, until the activity's own
        start-to-close has passed, after which Temporal has timed it out for certain.

        Safety never depends on this: a grant released here while its workflow did get it
        (a completion applied whose answer was lost, then retried: NOT_FOUND) only makes that
        workflow's next step find no grant (LOCK_LOST), and it re-acquires; a stale holder is
        kept out by the resources' fence checks, whatever this process believes.
        """
        assert self._temporal is not None
        handle = self._temporal.get_async_activity_handle(task_token=info.task_token)
        limit = info.start_to_close_timeout or timedelta(seconds=60)
        deadline = info.started_time + limit
        delay = 0.1
        while True:
            try:
                await handle.complete(result)
                return
            except RPCError as exc:
                why = exc.status.name.lower()
                if exc.status not in _TRANSIENT or datetime.now(UTC) >= deadline:
                    break
            except Exception as exc:  # not an answer from Temporal: nobody will get this grant
                why = type(exc).__name__
                break
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
        log.warning(
            "lock.grant_undelivered", key=lease.key, token=lease.token, payout_id=payout_id, why=why
        )
        await self._grants.give_back(lease)

    async def release_lock(self, req: m.StepRequest) -> None:
        """UC-01 step 9. Completes even when the lock server cannot answer: the SDK keeps that
        release pending and retries it until it succeeds or this process's session ends, so
        the grant never outlives its use (issue 24 item 6); see `HeldGrants.release`."""
        await self._grants.release(req)
