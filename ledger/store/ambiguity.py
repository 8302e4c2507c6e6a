"""Into and out of RAIL_AMBIGUOUS: the indeterminate submission, the lookup's two verdicts, and the
operator's break-glass abandon, with the audit rows of actions that change no state.

All are fenced like every other step (`ledger.store.fenced`); abandon also needs the lock
service's operator assertion when the store verifies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.audit import write_audit
from ledger.context import WorkContext
from ledger.errors import InvalidOperatorAssertion
from ledger.records import AlreadyAdvanced, Payout, check_text
from ledger.store.base import GrantLike, S
from ledger.store.fenced import FencedWrites
from lockservice.assertions import AssertionRefused


class AmbiguityActions(FencedWrites):
    """RAIL_SUBMITTED -> RAIL_AMBIGUOUS -> RAIL_ACKED, FAILED or ABANDONED; operator audit rows."""

    async def mark_ambiguous(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str = "indeterminate",
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_SUBMITTED -> RAIL_AMBIGUOUS: money may have moved; never submitted again."""
        check_text(reason, "reason")
        return await self._simple(
            "mark_ambiguous",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_SUBMITTED,
            to_state=S.RAIL_AMBIGUOUS,
            details={"reason": reason},
        )

    async def resolve_settled(
        self, payout_id: str, token: int, ctx: WorkContext, *, grant: GrantLike = None
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> RAIL_ACKED: a lookup by client reference found it settled."""
        return await self._simple(
            "resolve_settled",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.RAIL_ACKED,
        )

    async def resolve_absent(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        reason: str = "absent_at_rail",
        grant: GrantLike = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> FAILED: a lookup says the rail definitively never had it."""
        check_text(reason, "reason")
        return await self._simple(
            "resolve_absent",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.FAILED,
            reason=reason,
        )

    async def abandon(
        self,
        payout_id: str,
        token: int,
        ctx: WorkContext,
        *,
        operator: str,
        reason: str,
        grant: GrantLike = None,
        assertion: Mapping[str, Any] | None = None,
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> ABANDONED: break-glass, by an operator with identity and reason.

        Still fenced: the operator's command reaches the database through the workflow that
        holds the account's grant, so a stale holder cannot abandon under an old token. With
        assertion verification on, `assertion` must be the lock service's operator assertion
        for `abandon` of this payout, unexpired by this process's clock; the identity and reason
        inside it are audited (InvalidOperatorAssertion otherwise, before anything is written).
        """
        if self._assertions is not None:
            try:
                a = self._assertions.verify(assertion, action="abandon", payout_id=payout_id)
            except AssertionRefused as exc:
                raise InvalidOperatorAssertion(str(exc), reason=exc.code) from None
            operator, reason = a.identity, a.reason
        check_text(operator, "operator")
        check_text(reason, "reason")
        return await self._simple(
            "abandon",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.ABANDONED,
            reason=f"abandoned: {reason}",
            details={"operator": operator, "reason": reason},
            audit_actor=operator,
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
        """An audit row with no state change (a rejected operator signal, an escalation)."""
        check_text(actor, "actor")
        check_text(action, "action")
        async with self._pool.acquire() as conn, conn.transaction():
            await write_audit(
                conn,
                actor=actor,
                action=action,
                token=token,
                payout_id=payout_id,
                account_id=account_id,
                details=details,
            )
