"""`PayoutStore`: the store's one public face, a method per operation, each delegating by name to
the part that owns it (the table in `ledger.store`). One object read whole: its length is the
list of operations, each a signature and one call; the code of each is in its part.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal

import asyncpg

from ledger.context import WorkContext
from ledger.records import AlreadyAdvanced, AuditRow, Payout
from ledger.states import PayoutState
from ledger.store.ambiguity import AmbiguityActions
from ledger.store.base import GrantLike
from ledger.store.commands import CommandVerdict, OperatorCommands
from ledger.store.fenced import FencedWriter
from ledger.store.reads import Reads
from ledger.store.seeding import Seeding
from ledger.store.steps import WorkerSteps
from lockservice.verifiers import AssertionVerifier, GrantVerifier

__all__ = ["PayoutStore"]


class PayoutStore:
    """Accounts, funding, payouts and their fenced transitions, postings, and reads."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        enforce_fencing: bool = True,
        verifier: GrantVerifier | None = None,
        verify_assertions: bool = True,
    ) -> None:
        # Break-glass commands sent as Temporal signals (abandon) are authenticated by the lock
        # service's operator assertion, checked with the same public keys as grants. Off
        # (`verify_assertions=False`, an experiment switch) or without a verifier (a trusted
        # caller), the signal's free-text operator name is audited as given.
        assertions = (
            AssertionVerifier.of(verifier) if verifier is not None and verify_assertions else None
        )
        # The one fenced writer (FR-15, FR-16, INV-07: the grant check, the fencing switch, the
        # fenced statement), handed to every part that moves a payout.
        writer = FencedWriter(pool, enforce_fencing=enforce_fencing, verifier=verifier)
        self._writer = writer
        self._steps = WorkerSteps(writer)
        self._ambiguity = AmbiguityActions(pool, writer, assertions)
        self._commands = OperatorCommands(pool, assertions)
        self._seeding = Seeding(pool)
        self._reads = Reads(pool)

    @property
    def enforce_fencing(self) -> bool:
        """False only for the UC-03 negative control (FR-29): see `FencedWriter`."""
        return self._writer.enforce_fencing

    # The worker's steps (`ledger.store.steps.WorkerSteps`), each one fenced transaction.

    async def claim(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """PENDING -> CLAIMED, or FAILED(insufficient_funds): `WorkerSteps.claim`."""
        return await self._steps.claim(payout_id, token, ctx, grant=grant)

    async def stamp_account_fence(
        self, payout_id: str, token: int, *, grant: GrantLike = None
    ) -> None:
        """The account's fence raised to T, no payout row changed:
        `WorkerSteps.stamp_account_fence`."""
        await self._steps.stamp_account_fence(payout_id, token, grant=grant)

    async def mark_submitted(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED: `WorkerSteps.mark_submitted`."""
        return await self._steps.mark_submitted(payout_id, token, ctx, grant=grant)

    async def mark_acked(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> RAIL_ACKED: `WorkerSteps.mark_acked`."""
        return await self._steps.mark_acked(payout_id, token, ctx, grant=grant)

    async def mark_submitted_and_acked(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED -> RAIL_ACKED in one transaction:
        `WorkerSteps.mark_submitted_and_acked`."""
        return await self._steps.mark_submitted_and_acked(payout_id, token, ctx, grant=grant)

    async def ack_and_post(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """CLAIMED -> RAIL_SUBMITTED -> RAIL_ACKED -> POSTED with the ledger group, in one
        transaction, debited once: `WorkerSteps.ack_and_post`."""
        return await self._steps.ack_and_post(payout_id, token, ctx, grant=grant)

    async def mark_declined(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str,
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> FAILED, a business decline: `WorkerSteps.mark_declined`."""
        return await self._steps.mark_declined(payout_id, token, ctx, reason=reason, grant=grant)

    async def post(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_ACKED -> POSTED with the ledger group, debited once: `WorkerSteps.post`."""
        return await self._steps.post(payout_id, token, ctx, grant=grant)

    # Into and out of RAIL_AMBIGUOUS (`ledger.store.ambiguity.AmbiguityActions`), fenced too.

    async def mark_ambiguous(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str = "indeterminate",
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> RAIL_AMBIGUOUS: `AmbiguityActions.mark_ambiguous`."""
        return await self._ambiguity.mark_ambiguous(
            payout_id, token, ctx, reason=reason, grant=grant
        )

    async def resolve_settled(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> RAIL_ACKED: `AmbiguityActions.resolve_settled`."""
        return await self._ambiguity.resolve_settled(payout_id, token, ctx, grant=grant)

    async def resolve_absent(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str = "absent_at_rail",
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> FAILED: `AmbiguityActions.resolve_absent`."""
        return await self._ambiguity.resolve_absent(
            payout_id, token, ctx, reason=reason, grant=grant
        )

    async def abandon(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        operator: str = "",
        reason: str = "",
        grant: GrantLike = None,
        assertion: Mapping[str, Any] | None = None,
        command_id: str = "",
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> ABANDONED, break-glass, once: `AmbiguityActions.abandon`."""
        return await self._ambiguity.abandon(
            payout_id,
            token,
            ctx,
            operator=operator,
            reason=reason,
            grant=grant,
            assertion=assertion,
            command_id=command_id,
        )

    async def record_audit(
        self,
        *,
        actor: str,
        action: str,
        payout_id: str | None = None,
        account_id: str | None = None,
        token: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """An audit row with no state change: `AmbiguityActions.record_audit`."""
        await self._ambiguity.record_audit(
            actor=actor,
            action=action,
            payout_id=payout_id,
            account_id=account_id,
            token=token,
            details=details,
        )

    # Operator commands (`ledger.store.commands.OperatorCommands`): judged once, ended once.

    async def accept_command(
        self,
        *,
        command_id: str,
        payout_id: str,
        action: str,
        claimed_operator: str,
        reason: str,
        assertion: Mapping[str, Any] | None,
        via: str,
    ) -> CommandVerdict:
        """Verify and record a command, or record its refusal:
        `OperatorCommands.accept_command`."""
        return await self._commands.accept_command(
            command_id=command_id,
            payout_id=payout_id,
            action=action,
            claimed_operator=claimed_operator,
            reason=reason,
            assertion=assertion,
            via=via,
        )

    async def settle_command(
        self,
        *,
        command_id: str,
        outcome: Literal["carried_out", "refused"],
        why: str = "",
        code: str = "",
        details: Mapping[str, Any] | None = None,
        audit_action: str | None = None,
    ) -> CommandVerdict:
        """End an accepted command, once: `OperatorCommands.settle_command`."""
        return await self._commands.settle_command(
            command_id=command_id,
            outcome=outcome,
            why=why,
            code=code,
            details=details,
            audit_action=audit_action,
        )

    async def command(self, command_id: str) -> CommandVerdict | None:
        """One command's verdict as recorded: `OperatorCommands.command`."""
        return await self._commands.command(command_id)

    async def commands_of(self, payout_id: str) -> list[CommandVerdict]:
        """Every operator command of a payout, oldest first: `OperatorCommands.commands_of`."""
        return await self._commands.commands_of(payout_id)

    # Before any lock (`ledger.store.seeding.Seeding`): not fenced.

    async def create_account(self, account_id: str, ctx: WorkContext) -> None:
        """A customer account with a zero balance and fence 0: `Seeding.create_account`."""
        await self._seeding.create_account(account_id, ctx)

    async def fund_account(self, account_id: str, amount: int, ctx: WorkContext) -> uuid.UUID:
        """Credit a customer account, a balanced group of its own: `Seeding.fund_account`."""
        return await self._seeding.fund_account(account_id, amount, ctx)

    async def create_payout(
        self, payout_id: str, account_id: str, amount: int, ctx: WorkContext
    ) -> Payout:
        """A PENDING payout: `Seeding.create_payout`."""
        return await self._seeding.create_payout(payout_id, account_id, amount, ctx)

    # Reads (`ledger.store.reads.Reads`): no writes.

    async def balance(self, account_id: str) -> int:
        """An account's committed balance: `Reads.balance`."""
        return await self._reads.balance(account_id)

    async def get_payout(self, payout_id: str) -> Payout:
        """One payout as committed: `Reads.get_payout`."""
        return await self._reads.get_payout(payout_id)

    async def list_payouts(
        self,
        *,
        state: PayoutState | str | None = None,
        account_id: str | None = None,
        limit: int = 1000,
        recent_first: bool = False,
    ) -> list[Payout]:
        """Payouts by state and/or account: `Reads.list_payouts`."""
        return await self._reads.list_payouts(
            state=state, account_id=account_id, limit=limit, recent_first=recent_first
        )

    async def audit_trail(self, payout_id: str | None = None, limit: int = 200) -> list[AuditRow]:
        """The audit log, oldest first: `Reads.audit_trail`."""
        return await self._reads.audit_trail(payout_id, limit)
