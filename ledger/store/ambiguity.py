"""Into and out of RAIL_AMBIGUOUS: the indeterminate submission, the lookup's two verdicts, and the
operator's break-glass abandon, with the audit rows of actions that change no state.

All are fenced like every other step, through the `FencedWriter` this object is given
(`ledger.store.fenced`); abandon also needs the lock service's operator assertion when the store
verifies them. The audit rows of `record_audit` change no state and are not fenced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg

from ledger.audit import write_audit
from ledger.context import WorkContext
from ledger.errors import InvalidOperatorAssertion
from ledger.records import AlreadyAdvanced, Payout, check_text
from ledger.store.base import GrantLike, S
from ledger.store.fenced import FencedWriter
from lockservice.verifiers import AssertionRefused, AssertionVerifier

__all__ = ["AmbiguityActions"]


class AmbiguityActions:
    """RAIL_SUBMITTED -> RAIL_AMBIGUOUS -> RAIL_ACKED, FAILED or ABANDONED; operator audit rows."""

    def __init__(
        self, pool: asyncpg.Pool, writer: FencedWriter, assertions: AssertionVerifier | None
    ) -> None:
        self._pool = pool
        self._writer = writer
        # None: operator assertions are not verified (see `PayoutStore`); the abandon's
        # operator and reason are audited as given.
        self._assertions = assertions

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
        return await self._writer.transition(
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
        return await self._writer.transition(
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
        return await self._writer.transition(
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
        operator: str = "",
        reason: str = "",
        grant: GrantLike = None,
        assertion: Mapping[str, Any] | None = None,
        command_id: str = "",
    ) -> Payout | AlreadyAdvanced:
        """RAIL_AMBIGUOUS -> ABANDONED: break-glass, by an operator with identity and reason.

        Still fenced: the operator's command reaches the database through the workflow that
        holds the account's grant, so a stale holder cannot abandon under an old token.

        `command_id`: the command this store accepted (`accept_command`: assertion verified,
        nonce recorded). It is carried out under that acceptance, whatever the assertion's expiry
        now, and ends `carried_out` in the same transaction as the transition; the audited actor
        and reason are the ones recorded at acceptance. A command that is unknown, for another
        payout or action, or ended already is refused (InvalidOperatorAssertion, nothing
        written): an accepted abandon is carried out once.

        Without `command_id` (workflows started before operator commands were recorded): with
        verification on, `assertion` must be the lock service's operator assertion for
        `abandon` of this payout, unexpired by this process's clock.
        """
        also = None
        if command_id:
            operator, reason = await self._accepted_abandon(payout_id, command_id)

            async def also(conn: asyncpg.Connection) -> None:
                ended = await conn.fetchval(
                    "UPDATE paydb.operator_commands SET outcome = 'carried_out',"
                    " outcome_at = clock_timestamp() WHERE command_id = $1 AND outcome IS NULL"
                    " RETURNING command_id",
                    command_id,
                )
                if ended is None:
                    raise InvalidOperatorAssertion(
                        f"operator command {command_id} ended already", reason="command_ended"
                    )
        elif self._assertions is not None:
            try:
                a = self._assertions.verify(assertion, action="abandon", payout_id=payout_id)
            except AssertionRefused as exc:
                raise InvalidOperatorAssertion(str(exc), reason=exc.code) from None
            operator, reason = a.identity, a.reason
        check_text(operator, "operator")
        check_text(reason, "reason")
        return await self._writer.transition(
            "abandon",
            payout_id,
            token,
            ctx,
            grant=grant,
            from_state=S.RAIL_AMBIGUOUS,
            to_state=S.ABANDONED,
            reason=f"abandoned: {reason}",
            details={"operator": operator, "reason": reason, "command_id": command_id or None},
            audit_actor=operator,
            also=also,
        )

    async def _accepted_abandon(self, payout_id: str, command_id: str) -> tuple[str, str]:
        """(actor, reason) of an accepted, not yet ended abandon of this payout."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT payout_id, action, actor, reason, nonce, outcome"
                " FROM paydb.operator_commands WHERE command_id = $1",
                command_id,
            )
        if row is None or row["nonce"] is None:
            raise InvalidOperatorAssertion(
                f"no accepted operator command {command_id!r}", reason="command_not_accepted"
            )
        if row["payout_id"] != payout_id or row["action"] != "abandon":
            raise InvalidOperatorAssertion(
                f"operator command {command_id} is a {row['action']} of payout "
                f"{row['payout_id']}, not an abandon of {payout_id}",
                reason="wrong_command",
            )
        if row["outcome"] is not None:
            raise InvalidOperatorAssertion(
                f"operator command {command_id} ended already ({row['outcome']})",
                reason="command_ended",
            )
        return str(row["actor"]), str(row["reason"])

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
