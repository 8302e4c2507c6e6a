"""The shared-queue steps that need no grant: read-only rail lookups (UC-05), the escalation
of an ambiguous payout past its SLA, and the judging of operator commands (their acceptance by
the payment store, their refusal and its audit).
"""

from __future__ import annotations

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.support import log
from ledger import CommandVerdict, PayoutStore, UnknownPayout
from ledger.errors import InvalidIdentifier
from ledger.store.commands import unverified
from railproxy.client import RailProxyClient
from railproxy.errors import LookupUnavailable, ProxyClientError

__all__ = ["LookupSteps", "rail_evidence", "verdict_of"]


class LookupSteps:
    """lookup_rail, escalate_ambiguous, the operator commands' acceptance and refusals (shared
    queue): they need no grant of this process."""

    def __init__(self, *, store: PayoutStore, proxy: RailProxyClient, worker_id: str) -> None:
        self._store = store
        self._proxy = proxy
        self._worker_id = worker_id

    async def lookup_rail(self, req: m.LookupRequest) -> m.LookupResult:
        """Read-only evidence for an ambiguous payout (UC-05): never submits anything.

        A `not_found` is "absent" only when the proxy says it proves absence (its attempt records,
        the rail's completeness window and the Connection's margins, A-08); this worker's clock
        plays no part. Otherwise the payout stays ambiguous ("pending") and ages.
        """
        return await rail_evidence(self._proxy, req.client_reference, req.payout_id)

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

    async def record_signal_rejected(self, rej: m.SignalRejection) -> None:
        """Audit an operator command the workflow refused or could not carry out (FR-30).
        Retried without limit; the event follows the committed row, once per fact."""
        workflow_id = activity.info().workflow_id or ""
        payout_id = workflow_id.removeprefix("payout-")
        await self._store.record_audit(
            # A name nobody authenticated: marked, so it never reads as a verified identity.
            actor=unverified(rej.operator),
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

    async def accept_operator_command(self, req: m.CommandRequest) -> m.CommandVerdict:
        """The payment store verifies the command's operator assertion (signature, action,
        payout, the lock key of its account for a revoke, expiry) and records its nonce, or
        records the refusal with its audit row. Retried without limit by the workflow: the
        verdict recorded first is the answer (idempotent per command id)."""
        try:
            verdict = await self._store.accept_command(
                command_id=req.command_id,
                payout_id=req.payout_id,
                action=req.action,
                claimed_operator=req.operator,
                reason=req.reason,
                assertion=req.assertion,
                via=req.via,
            )
        except (UnknownPayout, InvalidIdentifier) as exc:
            raise ApplicationError(str(exc), type=m.COMMAND_REFUSED, non_retryable=True) from exc
        return verdict_of(verdict)

    async def settle_operator_command(self, req: m.CommandSettlement) -> m.CommandVerdict:
        """Refuse an accepted command that will not be carried out (the rail's evidence came
        first, the payout ended, ...): its one audit row, in the same transaction."""
        verdict = await self._store.settle_command(
            command_id=req.command_id, outcome="refused", why=req.why, code=req.code
        )
        return verdict_of(verdict)


async def rail_evidence(
    proxy: RailProxyClient, client_reference: str, payout_id: str
) -> m.LookupResult:
    """What the rail says of one payout, through the proxy: settled, declined, absent (only when
    the proxy proves it), pending, or unavailable. Never submits anything."""
    try:
        found = await proxy.lookup(client_reference, payout_id=payout_id)
    except (LookupUnavailable, ProxyClientError, httpx.HTTPError) as exc:
        return m.LookupResult(status="unavailable", detail=str(exc))
    if found.status in ("settled", "declined", "pending"):
        return m.LookupResult(status=found.status)
    # Money could move while our ledger says FAILED if a not_found were taken as absence
    # before the rail's window covers the attempt: only the proxy's proven `absent` counts.
    if found.absent:
        return m.LookupResult(status="absent", detail=found.reason)
    return m.LookupResult(status="pending", detail=found.reason or "absence not proven")


def verdict_of(v: CommandVerdict) -> m.CommandVerdict:
    return m.CommandVerdict(
        command_id=v.command_id,
        accepted=v.accepted,
        actor=v.actor,
        reason=v.reason,
        outcome=v.outcome,
        code=v.code,
        why=v.why,
    )
