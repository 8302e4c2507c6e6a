"""Lock steps of a payout: acquire (and hand the grant over to its workflow), release, the
idle-lease sweeper, and the break-glass revoke through the lock service.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities import models as m
from activities.payout.base import PayoutActivitiesBase
from activities.payout.lookups import verdict_of
from activities.payout.support import _heartbeating, _HeldGrant, _past_start_to_close, log
from common import correlation
from common.lockkey import lock_key
from ledger import TERMINAL_STATES
from lockservice.api import LockError
from lockservice.client import Lease, NotAcquiredError

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


class LockSteps(PayoutActivitiesBase):
    """acquire_lock and revoke_lock (shared queue), release_lock (holder queue), the sweeper."""

    @activity.defn(name=m.ACQUIRE_LOCK)
    async def acquire_lock(self, req: m.AcquireRequest) -> m.AcquireResult:
        """UC-01 step 2. Bounded, jittered retries live in the SDK (FR-28); no grant, no work.
        The payout's correlation id goes with the request: the lock server's events carry it."""
        with correlation.bound(req.context.correlation_id):
            return await self._acquire_lock(req)

    async def _acquire_lock(self, req: m.AcquireRequest) -> m.AcquireResult:
        taken = await self._take_lease(req)
        if isinstance(taken, m.AcquireResult):
            return taken
        result = m.AcquireResult(acquired=True, token=taken.token, worker_queue=self._worker_queue)
        return self._deliver(taken, result, req.payout_id)

    async def _take_lease(self, req: m.AcquireRequest) -> Lease | m.AcquireResult:
        """The account's grant, held by this process (registered for its steps and the idle
        sweeper), or why not (an AcquireResult with acquired=False)."""
        try:
            # Heartbeats while it waits on the lock server: the workflow gives this activity a
            # heartbeat timeout, so one taken by a frozen worker is retried elsewhere in seconds.
            async with _heartbeating():
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
        if _past_start_to_close(activity.info()):
            # Temporal has timed this activity out already, so this answer would go nowhere and
            # the grant with it: give it back now instead of leaving it to the idle sweeper.
            log.warning("lock.acquired_too_late", key=lease.key, token=lease.token)
            with contextlib.suppress(LockError, httpx.HTTPError):
                await self._locks.release(lease)
            return m.AcquireResult(acquired=False, reason="late")
        self._leases[(lease.key, lease.token)] = _HeldGrant(lease)
        return lease

    def _deliver(self, lease: Lease, result: T, payout_id: str) -> T:
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
        held = self._leases.pop((lease.key, lease.token), None)
        log.warning(
            "lock.grant_undelivered", key=lease.key, token=lease.token, payout_id=payout_id, why=why
        )
        if held is not None:
            # A failure here is not the end of it: the SDK retries the release until it
            # succeeds or the session ends (lockservice._releases).
            with contextlib.suppress(LockError, httpx.HTTPError):
                await self._locks.release(lease)

    @activity.defn(name=m.REVOKE_LOCK)
    async def revoke_lock(self, req: m.RevokeRequest) -> None:
        """Break-glass (UC-06) through the lock service, which audits and alerts; revoking does
        not undo a side effect in flight, it only fences the old holder out.

        Retried without limit by the workflow: an unreachable lock service or database (raised
        here) is an outage to wait out; a 4xx is the lock service refusing the command, which is
        final (non-retryable) and reported by the workflow as a rejected signal. A retry after
        the revoke went through but its audit row did not can revoke a second time; that costs
        the current holder its grant (it re-acquires with a higher token), never safety.
        """
        # The lock server verifies the operator assertion the signal carried (action, payout,
        # expiry, its own signature) and audits the identity inside; without one it refuses.
        body = {
            "key": lock_key(req.account_id),
            "operator": req.operator,
            "reason": req.reason,
            "payout_id": req.payout_id,
            "assertion": req.assertion,
        }
        response = await self._lock_http.post("/v1/locks/revoke", json=body)
        if response.status_code >= 400:
            raise ApplicationError(
                f"revoke refused: HTTP {response.status_code} {response.text}",
                non_retryable=response.status_code < 500,
            )
        revoked = response.json()
        await self._store.record_audit(
            actor=str(revoked.get("operator") or req.operator),  # the identity the server audited
            action="lock_revoke_requested",
            payout_id=req.payout_id or None,
            account_id=req.account_id,
            details={"reason": req.reason, **revoked},
        )

    @activity.defn(name=m.CARRY_OUT_REVOKE)
    async def carry_out_revoke(self, req: m.RevokeRequest) -> m.CommandVerdict:
        """An accepted revoke command (patch `operator-commands`), carried out once: the lock
        server verifies its operator assertion again (signature, action, payout, the lock key of
        the payout's account, expiry) and revokes; the command then ends `carried_out` with the
        audit row `lock_revoke_requested`, or `refused` with the server's reason (a 4xx).

        Retried without limit (an outage of the lock server or the database only delays it): a
        retry finds the command ended and does nothing. Only a retry after the lock server
        revoked but before the database recorded it can revoke twice; that costs the account's
        current holder its grant (it re-acquires with a higher token), never safety.
        """
        known = await self._store.command(req.command_id)
        if known is not None and known.outcome is not None:
            return verdict_of(known)
        payout = await self._current(req.payout_id)
        if payout.state in TERMINAL_STATES:
            # The account's lock may belong to its next payout by now: never revoke it for this
            # one (the workflow cancels a revoke still pending when its payout ends).
            verdict = await self._store.settle_command(
                command_id=req.command_id,
                outcome="refused",
                code="terminal",
                why=f"payout reached {payout.state} before the revoke was carried out",
            )
            return verdict_of(verdict)
        body = {
            "key": lock_key(req.account_id),
            "operator": req.operator,
            "reason": req.reason,
            "payout_id": req.payout_id,
            "assertion": req.assertion,
        }
        response = await self._lock_http.post("/v1/locks/revoke", json=body)
        if response.status_code >= 500:
            raise ApplicationError(f"lock service unavailable: HTTP {response.status_code}")
        if response.status_code >= 400:
            code = _error_code(response)
            verdict = await self._store.settle_command(
                command_id=req.command_id,
                outcome="refused",
                code=code,
                why=f"the lock service refused the revoke: HTTP {response.status_code} "
                f"{code}: {response.text[:300]}",
            )
            return verdict_of(verdict)
        revoked = response.json()
        verdict = await self._store.settle_command(
            command_id=req.command_id,
            outcome="carried_out",
            why=f"revoked token {revoked.get('revoked_token')} of {body['key']}",
            details=revoked,
            audit_action="lock_revoke_requested",
        )
        return verdict_of(verdict)

    @activity.defn(name=m.RELEASE_LOCK)
    async def release_lock(self, req: m.StepRequest) -> None:
        """UC-01 step 9. Completes even when the lock server cannot answer: the SDK keeps that
        release pending and retries it until it succeeds or this process's session ends, so
        the grant never outlives its use (issue 24 item 6); see `_release`."""
        await self._release(req)

    # ------------------------------------------------------------------ leaked grants

    async def sweep_idle_leases(self, idle_s: float, every_s: float = 5.0) -> None:
        """Release grants this process holds that no step has used for `idle_s`; runs until
        cancelled (worker_main starts it).

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
            for k, held in list(self._leases.items()):
                if held.active or now - held.idle_since < idle_s:
                    continue
                if self._leases.pop(k, None) is None:
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


def _error_code(response: httpx.Response) -> str:
    """The lock server's stable error name (`{"code": ...}`), or the status as text."""
    try:
        body = response.json()
    except ValueError:
        return f"http_{response.status_code}"
    code = body.get("code") if isinstance(body, dict) else None
    return str(code) if code else f"http_{response.status_code}"
