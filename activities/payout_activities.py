"""The activities of PayoutWorkflow: each one step of UC-01, run by the process that holds the
account's lock session.

Every step that writes checks the grant first (`still_held()`, a liveness aid) and then presents
the grant's token to the resource, which is what actually stops a stale holder (FR-15, FR-17).
A fenced rejection becomes a non-retryable `FencedOut` ApplicationError: the workflow abandons
this grant at once and never retries under the same token.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities import models as m
from common import correlation
from common.credentials import auth_headers
from common.lockkey import lock_key
from common.logs import get_logger
from ledger import AlreadyAdvanced, FencedOut, Payout, PayoutState, PayoutStore, UnknownPayout
from ledger import WorkContext as LedgerContext
from ledger.errors import InvalidGrant, InvalidOperatorAssertion, InvalidTransition
from ledger.states import TERMINAL_STATES
from lockservice.api import LockError, NotHeld
from lockservice.client import Lease, LockClient, NotAcquiredError
from lockservice.grants import SignedGrant
from railproxy.client import RailProxyClient, SubmitResult
from railproxy.errors import LookupUnavailable, ProxyClientError
from railproxy.models import (
    AttemptRecord,
    GrantIn,
    HandoffCertainty,
    Outcome,
    SubmitContext,
    SubmitRequest,
)

log = get_logger("activities.payout")
S = PayoutState
_MAX_ID = 128


def _fenced(err: FencedOut | str) -> ApplicationError:
    return ApplicationError(str(err), type=m.FENCED_OUT, non_retryable=True)


def _lost(req: m.StepRequest, reason: str) -> ApplicationError:
    log.warning(
        "lock.lost_detected",
        key=lock_key(req.account_id),
        token=req.token,
        reason=reason,
        payout_id=req.payout_id,
    )
    return ApplicationError(
        f"grant {req.token} lost: {reason}", type=m.LOCK_LOST, non_retryable=True
    )


def _latest_live_attempt(attempts: list[AttemptRecord]) -> AttemptRecord | None:
    """The attempt that counts: the latest one that may have reached the rail."""
    live = [a for a in attempts if a.outcome != Outcome.NOT_SUBMITTED]
    return max(live, key=lambda a: a.attempt_id) if live else None


def _attempt_view(a: AttemptRecord | None) -> m.AttemptView | None:
    if a is None:
        return None
    return m.AttemptView(
        attempt_id=str(a.attempt_id),
        outcome=a.outcome.value if a.outcome else None,
        token=a.token,
        recorded_at=a.recorded_at.isoformat(),
    )


def _view(
    p: Payout, attempt: AttemptRecord | m.AttemptView | None = None, **kw: Any
) -> m.PayoutView:
    return m.PayoutView(
        payout_id=p.payout_id,
        account_id=p.account_id,
        state=str(p.state),
        amount=p.amount,
        fence=p.fence,
        client_reference=p.client_reference,
        failure_reason=p.failure_reason,
        attempt=attempt if isinstance(attempt, m.AttemptView) else _attempt_view(attempt),
        **kw,
    )


#: The UC-01 step a running holder activity is at (`_progress`), sent with every heartbeat: the
#: Temporal UI and `temporal workflow describe` show it as the pending activity's last heartbeat
#: details, so each step of the merged `execute_payout` stays identifiable while it runs.
_PROGRESS: contextvars.ContextVar[list[dict[str, str]] | None] = contextvars.ContextVar(
    "holder_progress", default=None
)


def _progress(step: str, state: str) -> None:
    """Record (and heartbeat at once) that the running holder activity is at `step`."""
    details = _PROGRESS.get()
    if details is None:
        return
    details[:] = [{"step": step, "state": state}]
    activity.heartbeat(*details)


@contextlib.asynccontextmanager
async def _heartbeating(
    interval_s: float = 1.0, details: list[dict[str, str]] | None = None
) -> AsyncIterator[None]:
    """Heartbeat while a long step runs, so a dead worker is noticed by its heartbeat timeout;
    each heartbeat carries the step's current `details` (see `_progress`)."""

    async def beat() -> None:
        while True:
            activity.heartbeat(*(details or ()))
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _past_start_to_close(info: activity.Info, margin_s: float = 1.0) -> bool:
    """Whether Temporal has (nearly) timed out this activity attempt, on this host's clock."""
    limit = info.start_to_close_timeout
    if limit is None:
        return False
    return datetime.now(UTC) >= info.started_time + limit - timedelta(seconds=margin_s)


@dataclass
class _HeldGrant:
    """A grant this process holds, and how the critical-section steps are using it."""

    lease: Lease
    active: int = 0  # steps running under it now
    idle_since: float = field(default_factory=time.monotonic)


GrantArg = SignedGrant | None
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
_Step = Callable[["PayoutActivities", m.StepRequest], Awaitable[Any]]


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


class PayoutActivities:
    """Bound methods registered on the worker; one instance per worker process."""

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
            base_url=lock_url, timeout=10.0, headers=auth_headers(token)
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

    async def __aenter__(self) -> PayoutActivities:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the lock-server client; once the workers running these activities have stopped."""
        await self._lock_http.aclose()

    def shared_queue_activities(self) -> list[Callable[..., Any]]:
        """Activities any worker may run: they need no grant held by this process."""
        return [
            self.acquire_lock,
            self.lookup_rail,
            self.escalate_ambiguous,
            self.revoke_lock,
            self.record_signal_rejected,
        ]

    def holder_queue_activities(self) -> list[Callable[..., Any]]:
        """The critical section: run only on this process's own queue, under its session."""
        return [
            self.execute_payout,
            self.reread_and_claim,
            self.submit_to_rail,
            self.recover_from_attempt,
            self.post_to_ledger,
            self.resolve_ambiguous,
            self.abandon_payout,
            self.release_lock,
        ]

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
        try:
            result = await write(grant)
        except FencedOut as exc:
            raise _fenced(exc) from exc
        except InvalidGrant as exc:
            # Our own grant refused (expired by its statement, a key this store does not accept):
            # writing under it is over; the workflow re-acquires, as for a lost lock.
            raise _lost(req, f"payment database refused the grant: {exc.reason}") from exc
        except InvalidTransition as exc:
            raise ApplicationError(str(exc), type=m.INVALID_TRANSITION, non_retryable=True) from exc
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

    # ------------------------------------------------------------------ shared queue

    @activity.defn(name=m.ACQUIRE_LOCK)
    async def acquire_lock(self, req: m.AcquireRequest) -> m.AcquireResult:
        """UC-01 step 2. Bounded, jittered retries live in the SDK (FR-28); no grant, no work.
        The payout's correlation id goes with the request: the lock server's events carry it."""
        with correlation.bound(req.context.correlation_id):
            return await self._acquire_lock(req)

    async def _acquire_lock(self, req: m.AcquireRequest) -> m.AcquireResult:
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
        result = m.AcquireResult(acquired=True, token=lease.token, worker_queue=self._worker_queue)
        if self._temporal is None:
            return result
        info = activity.info()
        handover = asyncio.create_task(self._hand_over(info, lease, result, req.payout_id))
        self._handovers.add(handover)
        handover.add_done_callback(self._handovers.discard)
        activity.raise_complete_async()

    @property
    def handovers(self) -> int:
        """Grants being handed over to their workflows right now (tests, diagnostics)."""
        return len(self._handovers)

    async def _hand_over(
        self, info: activity.Info, lease: Lease, result: m.AcquireResult, payout_id: str
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
            with contextlib.suppress(LockError, httpx.HTTPError):
                await self._locks.release(lease)

    @activity.defn(name=m.LOOKUP_RAIL)
    async def lookup_rail(self, req: m.LookupRequest) -> m.LookupResult:
        """Read-only evidence for an ambiguous payout (UC-05): never submits anything.

        A `not_found` is "absent" only when the proxy says it proves absence (its attempt records,
        the rail's completeness window and the Connection's margins, A-08); this worker's clock
        plays no part. Otherwise the payout stays ambiguous ("pending") and ages.
        """
        try:
            found = await self._proxy.lookup(req.client_reference, payout_id=req.payout_id)
        except (LookupUnavailable, ProxyClientError, httpx.HTTPError) as exc:
            return m.LookupResult(status="unavailable", detail=str(exc))
        if found.status in ("settled", "declined", "pending"):
            return m.LookupResult(status=found.status)
        # Money could move while our ledger says FAILED if a not_found were taken as absence
        # before the rail's window covers the attempt: only the proxy's proven `absent` counts.
        if found.absent:
            return m.LookupResult(status="absent", detail=found.reason)
        return m.LookupResult(status="pending", detail=found.reason or "absence not proven")

    @activity.defn(name=m.ESCALATE_AMBIGUOUS)
    async def escalate_ambiguous(self, req: m.StepRequest) -> None:
        """The resolution SLA passed (A-10): audit it, then alert. Retried without limit by the
        workflow, so the alert follows the committed audit row: a database outage delays the
        alert instead of repeating it on every attempt."""
        await self._store.record_audit(
            actor=self._worker_id,
            action="ambiguity_escalated",
            payout_id=req.payout_id,
            account_id=req.account_id,
        )
        log.error(
            "alert",
            name="ambiguity_sla_exceeded",
            payout_id=req.payout_id,
            account_id=req.account_id,
            correlation_id=req.context.correlation_id,
        )

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

    @activity.defn(name=m.RECORD_SIGNAL_REJECTED)
    async def record_signal_rejected(self, rej: m.SignalRejection) -> None:
        """Audit an operator command the workflow refused or could not carry out (FR-30).
        Retried without limit; the event follows the committed row, once per fact."""
        workflow_id = activity.info().workflow_id or ""
        payout_id = workflow_id.removeprefix("payout-")
        await self._store.record_audit(
            actor=rej.operator or "unknown-operator",
            action=f"signal_rejected:{rej.signal}",
            payout_id=payout_id if payout_id != workflow_id else None,
            details={"reason": rej.reason, "why": rej.why},
        )
        log.warning(
            "operator.signal_rejected",
            signal=rej.signal,
            operator=rej.operator,
            reason=rej.reason,
            why=rej.why,
            workflow_id=workflow_id,
        )

    # ------------------------------------------------------------------ holder queue

    @activity.defn(name=m.EXECUTE_PAYOUT)
    @_holder_step
    async def execute_payout(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 steps 3-9 in one holder activity (patch `merged-holder-steps`): re-read and
        claim, submit, post, and the release of the grant once the payout is terminal.

        What prevents a double payout: the workflow schedules this activity with
        maximum_attempts=1, so no retry can reach the submit twice; the submit happens only when
        THIS attempt moved the payout PENDING -> CLAIMED (a payout found CLAIMED or later is
        returned to the workflow, whose state-based recovery reads the proxy's attempt record
        as evidence, exactly as after `reread_and_claim`); and the proxy itself refuses a second
        attempt for the payout (FR-18) and any token below the account's highest (FR-17). A
        failure or timeout anywhere after the claim leaves the payout CLAIMED, RAIL_SUBMITTED
        or RAIL_ACKED, and the workflow's next grant recovers from there by evidence, never by
        submitting again on a guess.

        Each step is visible while it runs (the heartbeat details: `{"step", "state"}`) and
        after (the result's `steps`), and the workflow upserts the payout's state.
        """
        steps: list[str] = []
        _progress("claim", "reading")
        payout = await self._current(req.payout_id)
        claimed_here = False
        if payout.state == S.PENDING:
            claimed_here, payout = await self._claim(req)
        else:
            await self._stamp_account_fence(req)
        steps.append("claim")
        if not claimed_here or payout.state != S.CLAIMED:
            # Found in flight (another holder's work) or FAILED at the claim (insufficient
            # funds): hand the state and its evidence to the workflow, as `reread_and_claim` does.
            attempt = None
            if payout.state in (S.CLAIMED, S.RAIL_SUBMITTED):
                attempt = await self._attempt(req.payout_id)
            return await self._finish(req, _view(payout, attempt), steps)
        # Claimed from PENDING by this attempt: no edge leads back to PENDING and a submit needs
        # CLAIMED, so nobody has submitted this payout and the proxy can hold no attempt for it.
        # The attempt read `reread_and_claim` makes here would find nothing: skipped.
        _progress("submit", str(payout.state))
        view = await self._submit(req, payout)
        steps.append("submit")
        if view.state != S.RAIL_ACKED:
            # NOT_SUBMITTED (still CLAIMED: the workflow backs off), FAILED (declined) or
            # RAIL_AMBIGUOUS (resolved by lookups, never resubmitted).
            return await self._finish(req, view, steps)
        _progress("post", view.state)
        posted = await self._write(
            req,
            lambda g: self._store.post(req.payout_id, req.token, self._ctx(req.context), grant=g),
        )
        steps.append("post")
        done = _view(posted, view.attempt, handoff_certainty=view.handoff_certainty)
        return await self._finish(req, done, steps)

    async def _claim(self, req: m.StepRequest) -> tuple[bool, Payout]:
        """The fenced claim of a PENDING payout; True when this call made the transition (not
        another holder before it: then the payout is re-read)."""
        grant = await self._grant(req)
        ctx = self._ctx(req.context)
        try:
            result = await self._store.claim(req.payout_id, req.token, ctx, grant=grant)
        except FencedOut as exc:
            raise _fenced(exc) from exc
        except InvalidGrant as exc:
            raise _lost(req, f"payment database refused the grant: {exc.reason}") from exc
        except InvalidTransition as exc:
            raise ApplicationError(str(exc), type=m.INVALID_TRANSITION, non_retryable=True) from exc
        if isinstance(result, AlreadyAdvanced):
            return False, await self._current(req.payout_id)
        self._crash_if_armed(req, result)
        return True, result

    async def _finish(
        self, req: m.StepRequest, view: m.PayoutView, steps: list[str]
    ) -> m.PayoutView:
        """UC-01 step 9 folded into the last step: a terminal payout's grant is released here,
        and the workflow schedules no separate release. Not terminal: the workflow goes on
        under the grant (recovery, backoff, lookups) and releases it itself."""
        if view.state in {str(s) for s in TERMINAL_STATES}:
            _progress("release", view.state)
            await self._release(req)
            steps.append("release")
            view.released = True
        view.steps = steps
        return view

    async def _release(self, req: m.StepRequest) -> None:
        """Best effort: a lost release only delays the next holder to the lease's expiry (the
        next grant has a higher token either way)."""
        held = self._leases.pop((lock_key(req.account_id), req.token), None)
        if held is None:
            return
        with (
            correlation.bound(req.context.correlation_id),
            contextlib.suppress(LockError, httpx.HTTPError),
        ):
            await self._locks.release(held.lease)

    @activity.defn(name=m.REREAD_AND_CLAIM)
    @_holder_step
    async def reread_and_claim(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 steps 3-4: re-read inside the lease; claim only a PENDING payout (FR-14).

        Whatever the state, the account's balance-row fence carries this token when the step
        returns (the claim stamps it; otherwise `stamp_account_fence` does): a holder that takes
        over a payout in flight fences the older holder out of the payment database before it
        does anything else, not only once it happens to write (INV-01, FR-15).
        """
        payout = await self._current(req.payout_id)
        if payout.state == S.PENDING:
            payout = await self._write(
                req,
                lambda g: self._store.claim(
                    req.payout_id, req.token, self._ctx(req.context), grant=g
                ),
            )
        else:
            await self._stamp_account_fence(req)
        attempt = None
        if payout.state in (S.CLAIMED, S.RAIL_SUBMITTED):
            # Recovery evidence (FR-24): what the proxy recorded, never how much time passed.
            attempt = await self._attempt(req.payout_id)
        return _view(payout, attempt)

    @activity.defn(name=m.SUBMIT_TO_RAIL)
    @_holder_step
    async def submit_to_rail(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 steps 5-7. Scheduled with maximum_attempts=1 and never retried here either.

        What stops a second payment: the proxy refuses a token below the account's highest
        (FR-17) and any second attempt for this payout whatever the token (FR-18), and it records
        the attempt before forwarding (FR-19), so recovery can always see it.
        """
        # `_holder_step` heartbeats from the start: if this process stalls anywhere in the step
        # (a GC pause, a SIGSTOP), the heartbeat timeout hands the payout to recovery within
        # seconds.
        payout = await self._current(req.payout_id)
        if payout.state != S.CLAIMED:
            return _view(payout, detail="not_claimed")
        return await self._submit(req, payout)

    async def _submit(self, req: m.StepRequest, payout: Payout) -> m.PayoutView:
        """The one submission of a CLAIMED payout, for `submit_to_rail` and `execute_payout`:
        both are scheduled with maximum_attempts=1 and call this at most once per attempt.
        The proxy refuses a second attempt for the payout (FR-18) and a token below the
        account's highest (FR-17), and records the attempt before forwarding (FR-19)."""
        grant = await self._grant(req)
        deadline = (
            datetime.fromisoformat(req.context.deadline_at)
            if req.context.deadline_at
            else self._now() + timedelta(seconds=30)
        )
        submit = SubmitRequest(
            payout_id=payout.payout_id,
            account_id=payout.account_id,
            amount=payout.amount,
            client_reference=payout.client_reference,
            token=req.token,
            # The proxy verifies the lock service's signature before anything else (INV-07).
            grant=None if grant is None else GrantIn(**grant.to_json()),
            context=SubmitContext(
                correlation_id=req.context.correlation_id[:_MAX_ID],
                causation_id=(req.context.causation_id or payout.payout_id)[:_MAX_ID],
                deadline_at=deadline,
            ),
        )
        if self._pause_before_submit:
            self._pause_before_submit = False
            log.warning(
                "experiment.pausing",
                worker_id=self._worker_id,
                token=req.token,
                payout_id=payout.payout_id,
            )
            os.kill(os.getpid(), signal.SIGSTOP)  # resumes here on SIGCONT, unaware of the gap
            log.warning(
                "experiment.resumed",
                worker_id=self._worker_id,
                token=req.token,
                still_held=self._held_quietly(req),
            )
        # Once sent, the exchange is not cut short by an activity cancellation: cancelling an
        # HTTP call cannot un-send money, it only loses the answer. The proxy records the outcome
        # either way; recovery reads it from there.
        exchange = asyncio.create_task(self._submit_logged(submit, req.context.correlation_id))
        result = await asyncio.shield(exchange)
        return await self._apply_submit_result(req, payout, result)

    async def _submit_logged(self, submit: SubmitRequest, correlation_id: str) -> SubmitResult:
        result = await self._proxy.submit(submit)
        log.info(
            "rail.submit",
            payout_id=submit.payout_id,
            account_id=submit.account_id,
            token=submit.token,
            handoff_certainty=result.handoff_certainty.value,
            outcome=result.outcome.value if result.outcome else None,
            code=result.code,
            correlation_id=correlation_id,
        )
        return result

    async def _apply_submit_result(
        self, req: m.StepRequest, payout: Payout, result: SubmitResult
    ) -> m.PayoutView:
        ctx = self._ctx(req.context)
        if result.code == "INVALID_GRANT":
            # Nothing was forwarded or recorded; our grant cannot be used there: re-acquire.
            raise _lost(req, "rail proxy refused the grant")
        if result.code == "STALE_TOKEN":
            # The second enforcement point fenced us out: a newer grant exists.
            raise _fenced(
                f"rail proxy: token {result.presented_token} below {result.highest_token}"
            )
        if result.handoff_certainty == HandoffCertainty.NOT_SUBMITTED or result.outcome is None:
            # Nothing left our control (or we cannot tell yet: PROXY_NO_ANSWER). The payout stays
            # CLAIMED; the next round reads the proxy's attempt record before doing anything.
            return _view(
                payout,
                detail=result.code or "not_submitted",
                handoff_certainty=result.handoff_certainty.value,
            )
        if result.outcome == Outcome.ACKED:
            # RAIL_SUBMITTED and RAIL_ACKED follow each other here: one transaction, one commit
            # (the same two audit rows and events; issue 16).
            payout = await self._write(
                req,
                lambda g: self._store.mark_submitted_and_acked(
                    payout.payout_id, req.token, ctx, grant=g
                ),
            )
        else:
            payout = await self._write(
                req,
                lambda g: self._store.mark_submitted(payout.payout_id, req.token, ctx, grant=g),
            )
        payout = await self._record_outcome(req, payout, result.outcome)
        attempt = m.AttemptView(
            attempt_id=str(result.attempt_id), outcome=result.outcome.value, token=req.token
        )
        return _view(payout, handoff_certainty=result.handoff_certainty.value, attempt=attempt)

    async def _record_outcome(
        self, req: m.StepRequest, payout: Payout, outcome: Outcome | None
    ) -> Payout:
        ctx = self._ctx(req.context)
        if payout.state != S.RAIL_SUBMITTED:
            return payout
        if outcome == Outcome.ACKED:
            return await self._write(
                req, lambda g: self._store.mark_acked(payout.payout_id, req.token, ctx, grant=g)
            )
        if outcome == Outcome.DECLINED:
            return await self._write(
                req,
                lambda g: self._store.mark_declined(
                    payout.payout_id, req.token, ctx, reason="declined_by_rail", grant=g
                ),
            )
        # UNKNOWN, or no outcome recorded: money may have moved. Never resubmitted (FR-23).
        return await self._write(
            req,
            lambda g: self._store.mark_ambiguous(
                payout.payout_id,
                req.token,
                ctx,
                reason="no_outcome_recorded" if outcome is None else "outcome_unknown",
                grant=g,
            ),
        )

    @activity.defn(name=m.RECOVER_FROM_ATTEMPT)
    @_holder_step
    async def recover_from_attempt(self, req: m.StepRequest) -> m.PayoutView:
        """UC-04: a payout left CLAIMED or RAIL_SUBMITTED by a holder that died or was fenced.

        The proxy's attempt record decides: it was recorded before forwarding, so its absence
        proves nothing was sent, and an attempt with no outcome is ambiguous, never resubmitted.
        """
        payout = await self._current(req.payout_id)
        attempt = await self._attempt(req.payout_id)
        if payout.state == S.CLAIMED:
            if attempt is None:
                return _view(payout)  # nothing was handed off: the workflow may submit
            payout = await self._write(
                req,
                lambda g: self._store.mark_submitted(
                    payout.payout_id, req.token, self._ctx(req.context), grant=g
                ),
            )
        if payout.state == S.RAIL_SUBMITTED:
            payout = await self._record_outcome(req, payout, attempt.outcome if attempt else None)
        return _view(payout, attempt)

    @activity.defn(name=m.POST_TO_LEDGER)
    @_holder_step
    async def post_to_ledger(self, req: m.StepRequest) -> m.PayoutView:
        """UC-01 step 8: ledger rows, balance and POSTED in one fenced transaction."""
        payout = await self._write(
            req,
            lambda g: self._store.post(req.payout_id, req.token, self._ctx(req.context), grant=g),
        )
        return _view(payout)

    @activity.defn(name=m.RESOLVE_AMBIGUOUS)
    @_holder_step
    async def resolve_ambiguous(self, req: m.StepRequest) -> m.PayoutView:
        ctx = self._ctx(req.context)
        if req.resolution == "settled":

            def write(g: GrantArg) -> Awaitable[Payout | AlreadyAdvanced]:
                return self._store.resolve_settled(req.payout_id, req.token, ctx, grant=g)
        elif req.resolution == "absent":

            def write(g: GrantArg) -> Awaitable[Payout | AlreadyAdvanced]:
                return self._store.resolve_absent(req.payout_id, req.token, ctx, grant=g)
        else:
            raise ApplicationError(f"unknown resolution {req.resolution!r}", non_retryable=True)
        return _view(await self._write(req, write))

    @activity.defn(name=m.ABANDON_PAYOUT)
    @_holder_step
    async def abandon_payout(self, req: m.StepRequest) -> m.PayoutView:
        """Break-glass RAIL_AMBIGUOUS -> ABANDONED, with the operator as the audited actor: the
        identity inside the verified operator assertion. A refused assertion changes nothing and
        is final (non-retryable `OperatorAssertionRefused`): the workflow records the rejection."""
        ctx = self._ctx(req.context)  # "via" this worker; the store audits the operator
        try:
            return _view(
                await self._write(
                    req,
                    lambda g: self._store.abandon(
                        req.payout_id,
                        req.token,
                        ctx,
                        operator=req.operator,
                        reason=req.reason,
                        grant=g,
                        assertion=req.assertion,
                    ),
                )
            )
        except InvalidOperatorAssertion as exc:
            raise ApplicationError(
                f"operator assertion refused ({exc.reason}): {exc}",
                type=m.ASSERTION_REFUSED,
                non_retryable=True,
            ) from exc

    @activity.defn(name=m.RELEASE_LOCK)
    async def release_lock(self, req: m.StepRequest) -> None:
        """UC-01 step 9. Best effort: a lost release only delays the next holder to expiry."""
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
                with contextlib.suppress(LockError, httpx.HTTPError):
                    await self._locks.release(lease)
