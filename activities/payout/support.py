"""Module-level helpers of the payout activities' step objects: the errors a fenced or lost
grant raises, the workflow-facing views of a payout, and the heartbeat (and progress details)
of a running step; `HeldGrants.holding` (`grants.py`) wraps every holder step in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import models as m
from common.lockkey import lock_key
from common.logs import get_logger
from ledger import FencedOut, Payout, PayoutState
from lockservice.verifiers import SignedGrant
from railproxy.models import AttemptRecord, Outcome

__all__ = [
    "GrantArg",
    "S",
    "attempt_view",
    "fenced_error",
    "heartbeating",
    "latest_live_attempt",
    "log",
    "lost_error",
    "past_start_to_close",
    "payout_view",
    "progress",
    "reporting_progress",
]

log = get_logger("activities.payout")
S = PayoutState
GrantArg = SignedGrant | None


def fenced_error(err: FencedOut | str) -> ApplicationError:
    return ApplicationError(str(err), type=m.FENCED_OUT, non_retryable=True)


def lost_error(req: m.StepRequest, reason: str) -> ApplicationError:
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


def latest_live_attempt(attempts: list[AttemptRecord]) -> AttemptRecord | None:
    """The attempt that counts: the latest one that may have reached the rail."""
    live = [a for a in attempts if a.outcome != Outcome.NOT_SUBMITTED]
    return max(live, key=lambda a: a.attempt_id) if live else None


def attempt_view(a: AttemptRecord | None) -> m.AttemptView | None:
    if a is None:
        return None
    return m.AttemptView(
        attempt_id=str(a.attempt_id),
        outcome=a.outcome.value if a.outcome else None,
        token=a.token,
        recorded_at=a.recorded_at.isoformat(),
    )


def payout_view(
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
        attempt=attempt if isinstance(attempt, m.AttemptView) else attempt_view(attempt),
        **kw,
    )


#: The UC-01 step a running holder activity is at (`progress`), sent with every heartbeat: the
#: Temporal UI and `temporal workflow describe` show it as the pending activity's last heartbeat
#: details, so each step of the merged `execute_payout` stays identifiable while it runs long
#: enough to heartbeat (see `heartbeating`); the result's `steps` name them afterwards.
_PROGRESS: contextvars.ContextVar[list[dict[str, str]] | None] = contextvars.ContextVar(
    "holder_progress", default=None
)


def progress(step: str, state: str) -> None:
    """Record that the running holder activity is at `step`: the next heartbeat carries it."""
    details = _PROGRESS.get()
    if details is not None:
        details[:] = [{"step": step, "state": state}]


def _first_beat_s(interval_s: float) -> float:
    """When a step sends its first heartbeat: after half its heartbeat timeout.

    Why not at once: the heartbeat timeout runs from the attempt's start, so a heartbeat before
    half of it tells Temporal nothing it needs to notice a dead worker in time, and each one
    that reaches the server is an RPC and a write of the workflow's state there (issue 16:
    two per payout, the acquire's and `execute_payout`'s first, in a burst whose CPU Temporal
    dominates). The SDK sends the first heartbeat at once and throttles the rest to 0.8 x the
    timeout, so the gaps stay under the timeout. No heartbeat timeout: every `interval_s`."""
    timeout = activity.info().heartbeat_timeout
    return timeout.total_seconds() / 2 if timeout else interval_s


@contextlib.asynccontextmanager
async def heartbeating(
    interval_s: float = 1.0, details: list[dict[str, str]] | None = None
) -> AsyncIterator[None]:
    """Heartbeat while a long step runs, so a dead worker is noticed by its heartbeat timeout;
    each heartbeat carries the step's current `details` (see `progress`). A step shorter than
    half its heartbeat timeout sends none (`_first_beat_s`)."""

    async def beat() -> None:
        await asyncio.sleep(_first_beat_s(interval_s))
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


def past_start_to_close(info: activity.Info, margin_s: float = 1.0) -> bool:
    """Whether Temporal has (nearly) timed out this activity attempt, on this host's clock."""
    limit = info.start_to_close_timeout
    if limit is None:
        return False
    return datetime.now(UTC) >= info.started_time + limit - timedelta(seconds=margin_s)


@contextlib.asynccontextmanager
async def reporting_progress() -> AsyncIterator[None]:
    """Heartbeat for the whole block, each beat carrying the step `progress` last named in it."""
    details: list[dict[str, str]] = []
    reset = _PROGRESS.set(details)
    try:
        async with heartbeating(details=details):
            yield
    finally:
        _PROGRESS.reset(reset)
