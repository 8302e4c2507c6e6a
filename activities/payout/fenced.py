"""The fenced writer: every write the critical-section steps make to the payment store goes
through it, under the step's grant, and the store's refusals become the activity errors the
workflow acts on. Also the experiments' crash point (UC-04), right after a committed write.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Iterator

from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.grants import HeldGrants
from activities.payout.support import GrantArg, fenced_error, log, lost_error
from ledger import AlreadyAdvanced, FencedOut, Payout, PayoutStore, UnknownPayout
from ledger import WorkContext as LedgerContext
from ledger.errors import InvalidGrant, InvalidTransition

__all__ = ["HolderWriter", "current_payout", "store_refusals"]


@contextlib.contextmanager
def store_refusals(req: m.StepRequest) -> Iterator[None]:
    """The payment store's refusals of a fenced write, as the activity errors the workflow acts
    on; every one is non-retryable, so no refused write is ever repeated under the same token."""
    try:
        yield
    except FencedOut as exc:
        raise fenced_error(exc) from exc
    except InvalidGrant as exc:
        # Our own grant refused (expired by its statement, a key this store does not accept):
        # writing under it is over; the workflow re-acquires, as for a lost lock.
        raise lost_error(req, f"payment database refused the grant: {exc.reason}") from exc
    except InvalidTransition as exc:
        raise ApplicationError(str(exc), type=m.INVALID_TRANSITION, non_retryable=True) from exc


@contextlib.contextmanager
def known_payout() -> Iterator[None]:
    """A payout the payment store does not know, as the non-retryable activity error."""
    try:
        yield
    except UnknownPayout as exc:
        raise ApplicationError(str(exc), type=m.UNKNOWN_PAYOUT, non_retryable=True) from exc


async def current_payout(store: PayoutStore, payout_id: str) -> Payout:
    """The payout as the payment store has it now; an unknown one is a non-retryable error."""
    with known_payout():
        return await store.get_payout(payout_id)


class HolderWriter:
    """The lock holder's fenced writes: each presents this process's signed grant for the
    step's token to the payment store (whose own fence, `ledger.store`, refuses a stale one),
    with the worker as the audited actor."""

    def __init__(
        self, store: PayoutStore, grants: HeldGrants, *, worker_id: str, crash_at: str = ""
    ) -> None:
        self._store = store
        self._grants = grants
        self._worker_id = worker_id
        # UC-04 experiment only: SIGKILL this process right after a write reaches this state.
        self._crash_at = crash_at

    def ctx(self, c: m.WorkContext, actor: str | None = None) -> LedgerContext:
        return LedgerContext(
            correlation_id=c.correlation_id,
            causation_id=c.causation_id or None,
            actor=actor or self._worker_id,
        )

    async def current(self, payout_id: str) -> Payout:
        return await current_payout(self._store, payout_id)

    async def write(
        self, req: m.StepRequest, write: Callable[[GrantArg], Awaitable[Payout | AlreadyAdvanced]]
    ) -> Payout:
        """Run one fenced write; FencedOut aborts the grant, AlreadyAdvanced re-reads."""
        grant = await self._grants.signed_grant(req)
        with store_refusals(req):
            result = await write(grant)
        if isinstance(result, AlreadyAdvanced):
            # UC-01 alternate (a): another holder moved it on. Not an error: re-read and go on.
            return await self.current(req.payout_id)
        assert isinstance(result, Payout)
        self._crash_if_armed(req, result)
        return result

    async def claim(self, req: m.StepRequest) -> tuple[bool, Payout]:
        """The fenced claim of the payout, whatever state it is in; True when this call made the
        transition from PENDING. Otherwise (claimed or further on by an earlier holder) nothing
        but the account's balance fence changed (stamped with our token in the same committed
        transaction, `ledger.store.steps.WorkerSteps.claim`) and the payout is re-read."""
        grant = await self._grants.signed_grant(req)
        with known_payout(), store_refusals(req):
            result = await self._store.claim(
                req.payout_id, req.token, self.ctx(req.context), grant=grant
            )
        if isinstance(result, AlreadyAdvanced):
            return False, await self.current(req.payout_id)
        self._crash_if_armed(req, result)
        return True, result

    def crashes_at(self, state: str) -> bool:
        """Whether the UC-04 experiment's crash is armed at `state` (never outside it)."""
        return self._crash_at == state

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
