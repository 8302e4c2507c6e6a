"""The activities of PayoutWorkflow: each one step of UC-01, run by the process that holds the
account's lock session.

Every step that writes checks the grant first (`still_held()`, a liveness aid) and then presents
the grant's token to the resource, which is what actually stops a stale holder (FR-15, FR-17).
A fenced rejection becomes a non-retryable `FencedOut` ApplicationError: the workflow abandons
this grant at once and never retries under the same token.

The steps live in `activities/payout/`, one module per concern; PayoutActivities composes
them and says which queue runs which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.payout.base import _holder_step
from activities.payout.execute import ExecuteStep
from activities.payout.lock_steps import LockSteps
from activities.payout.lookups import LookupSteps
from common.lockkey import lock_key

# Importable from here as before (worker_main, tests): the one lock-key definition and the
# holder-step decorator.
__all__ = ["PayoutActivities", "_holder_step", "lock_key"]


class PayoutActivities(LockSteps, ExecuteStep, LookupSteps):
    """Bound methods registered on the worker; one instance per worker process."""

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
            self.accept_operator_command,
            self.settle_operator_command,
            self.carry_out_revoke,
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
