"""Operator commands (abandon, revoke) as the payment store judges them: verified once, when the
workflow accepts them, recorded with their assertion's nonce (single use), and ended exactly once,
carried out or refused, each end with one audit row (FR-30; docs/security.md).

Why the store: it holds the lock service's public keys already (grants, INV-07), so it can check
an operator assertion offline, and its table (`paydb.operator_commands`) is where a replay meets
the nonce it reuses. An abandon is later carried out against the recorded acceptance
(`ledger.store.ambiguity`), so an assertion that expires while the abandon waits for a grant is
carried out under the check made at acceptance, never dropped and never re-judged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from common.lockkey import lock_key
from ledger.audit import write_audit
from ledger.errors import InvalidIdentifier, UnknownPayout
from ledger.records import check_payout_id, check_text
from ledger.store.base import log
from lockservice.verifiers import AssertionRefused, AssertionVerifier

__all__ = [
    "ACTIONS",
    "REFUSED",
    "VIAS",
    "Action",
    "CommandVerdict",
    "OperatorCommands",
    "unverified",
]

Action = Literal["abandon", "revoke"]
ACTIONS: tuple[str, ...] = ("abandon", "revoke")
VIAS: tuple[str, ...] = ("signal", "update")
#: The audit action of every refused operator command (the name the runbooks and alerts use).
REFUSED = "signal_rejected:{action}"


def unverified(claim: object) -> str:
    """The audit actor for a name the sender typed: never mistaken for an authenticated one."""
    text = claim.strip() if isinstance(claim, str) else ""
    return f"unverified:{text[:100] or 'anonymous'}"


@dataclass(frozen=True, slots=True)
class CommandVerdict:
    """What the store decided about one command. `outcome` None: accepted, not carried out yet."""

    command_id: str
    action: str
    accepted: bool
    actor: str
    reason: str
    outcome: str | None = None
    code: str = ""  # why it was refused: an assertion code, "replayed", or the workflow's own
    why: str = ""

    @classmethod
    def of_row(cls, row: asyncpg.Record) -> CommandVerdict:
        detail = json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]
        return cls(
            command_id=row["command_id"],
            action=row["action"],
            accepted=row["nonce"] is not None,
            actor=row["actor"],
            reason=row["reason"],
            outcome=row["outcome"],
            code=str((detail or {}).get("code", "")),
            why=str((detail or {}).get("why", "")),
        )


_COLUMNS = "command_id, nonce, action, actor, reason, outcome, detail"


class OperatorCommands:
    """accept_command, settle_command: the life of one operator command, row by row.

    Not fenced: a command is judged and recorded here, and carried out (an abandon) through the
    fenced writer by `ledger.store.ambiguity`, under the payout's grant."""

    def __init__(self, pool: asyncpg.Pool, assertions: AssertionVerifier | None) -> None:
        self._pool = pool
        # None: the experiment switch (verification off) or a trusted caller (see `PayoutStore`).
        self._assertions = assertions

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
        """Verify the command's operator assertion and record it, or record its refusal.

        Idempotent per `command_id` (the activity is retried): the verdict recorded first is the
        answer. A valid assertion whose nonce another command already used is refused as
        `replayed`: an assertion authorises one command, once. A revoke's assertion must name
        the lock key of this payout's account, as this database knows it (issue 24, item 4).
        """
        _check_command(command_id, payout_id, action, via)
        async with self._pool.acquire() as conn, conn.transaction():
            verdict = await self._judge(
                conn,
                command_id=command_id,
                payout_id=payout_id,
                action=action,
                claimed_operator=claimed_operator,
                reason=reason,
                assertion=assertion,
                via=via,
            )
        # Stated once COMMIT succeeded: events state committed facts (NFR-08).
        if verdict.outcome == "refused":
            log.warning(
                "operator.signal_rejected",
                signal=action,
                operator=verdict.actor,
                command_id=command_id,
                code=verdict.code,
                why=verdict.why,
                via=via,
            )
        else:
            log.info(
                "operator.command_accepted",
                command_id=command_id,
                action=action,
                payout_id=payout_id,
                operator=verdict.actor,
                via=via,
            )
        return verdict

    async def _judge(
        self,
        conn: asyncpg.Connection,
        *,
        command_id: str,
        payout_id: str,
        action: str,
        claimed_operator: str,
        reason: str,
        assertion: Mapping[str, Any] | None,
        via: str,
    ) -> CommandVerdict:
        known = await self._command_row(conn, command_id)
        if known is not None:
            return CommandVerdict.of_row(known)
        account_id = await conn.fetchval(
            "SELECT account_id FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
        if account_id is None:
            raise UnknownPayout(f"unknown payout {payout_id!r}")

        def refuse(code: str, why: str) -> Awaitable[CommandVerdict]:
            return self._refused_row(
                conn,
                command_id=command_id,
                payout_id=payout_id,
                account_id=account_id,
                action=action,
                actor=unverified(claimed_operator),
                reason=reason,
                via=via,
                code=code,
                why=why,
            )

        if self._assertions is None:
            # The experiment switch (verification off): the typed name is recorded, marked.
            actor, nonce, text = unverified(claimed_operator), f"unverified:{command_id}", reason
        else:
            try:
                a = self._assertions.verify(
                    assertion,
                    action=action,
                    payout_id=payout_id,
                    key=lock_key(account_id) if action == "revoke" else None,
                )
            except AssertionRefused as exc:
                why = f"operator assertion refused ({exc.code}): {exc}"
                return await refuse(exc.code, why)
            actor, nonce, text = a.identity, a.nonce, a.reason
        first = await conn.fetchrow(
            "SELECT command_id, recorded_at FROM paydb.operator_commands WHERE nonce = $1",
            nonce,
        )
        if first is not None:
            why = (
                f"operator assertion already used by command {first['command_id']} at "
                f"{first['recorded_at'].isoformat()}: an assertion authorises one command, once"
            )
            return await refuse("replayed", why)
        row = await conn.fetchrow(
            "INSERT INTO paydb.operator_commands"
            " (command_id, nonce, payout_id, action, actor, verified, reason, via)"
            f" VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {_COLUMNS}",
            command_id,
            nonce,
            payout_id,
            action,
            actor,
            self._assertions is not None,
            text,
            via,
        )
        return CommandVerdict.of_row(row)

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
        """End an accepted command: refused (e.g. the rail's evidence came first, the lock
        service refused it, the payout ended), or carried out (a revoke; an abandon ends in its
        own transition). One audit row with the end, in the same transaction; idempotent."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "UPDATE paydb.operator_commands SET outcome = $2, outcome_at = clock_timestamp(),"
                " detail = $3::jsonb WHERE command_id = $1 AND outcome IS NULL"
                f" RETURNING {_COLUMNS}, payout_id",
                command_id,
                outcome,
                json.dumps({"code": code, "why": why, **(details or {})}, default=str),
            )
            if row is None:
                known = await self._command_row(conn, command_id)
                if known is None:
                    raise InvalidIdentifier(f"no accepted operator command {command_id!r}")
                return CommandVerdict.of_row(known)  # settled already (a retried activity)
            await write_audit(
                conn,
                actor=row["actor"],
                action=audit_action or REFUSED.format(action=row["action"]),
                payout_id=row["payout_id"],
                details={
                    "command_id": command_id,
                    "reason": row["reason"],
                    "why": why,
                    "code": code,
                    **(details or {}),
                },
            )
        log.info(
            "operator.command_settled",
            command_id=command_id,
            action=row["action"],
            outcome=outcome,
            operator=row["actor"],
            code=code,
        )
        return CommandVerdict.of_row(row)

    async def command(self, command_id: str) -> CommandVerdict | None:
        """One command's verdict as recorded; None if it never reached the store."""
        check_text(command_id, "command_id")
        async with self._pool.acquire() as conn:
            row = await self._command_row(conn, command_id)
        return None if row is None else CommandVerdict.of_row(row)

    async def commands_of(self, payout_id: str) -> list[CommandVerdict]:
        """Every operator command of a payout, oldest first (for `payouts payout status`)."""
        check_payout_id(payout_id)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS} FROM paydb.operator_commands WHERE payout_id = $1"
                " ORDER BY recorded_at, command_id",
                payout_id,
            )
        return [CommandVerdict.of_row(r) for r in rows]

    async def _command_row(self, conn: asyncpg.Connection, command_id: str) -> asyncpg.Record:
        return await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM paydb.operator_commands WHERE command_id = $1", command_id
        )

    async def _refused_row(
        self,
        conn: asyncpg.Connection,
        *,
        command_id: str,
        payout_id: str,
        account_id: str,
        action: str,
        actor: str,
        reason: str,
        via: str,
        code: str,
        why: str,
    ) -> CommandVerdict:
        """Record a refusal at acceptance (no nonce is taken) and its one audit row."""
        row = await conn.fetchrow(
            "INSERT INTO paydb.operator_commands (command_id, nonce, payout_id, action, actor,"
            " verified, reason, via, outcome, outcome_at, detail)"
            " VALUES ($1, NULL, $2, $3, $4, false, $5, $6, 'refused', clock_timestamp(),"
            f" $7::jsonb) RETURNING {_COLUMNS}",
            command_id,
            payout_id,
            action,
            actor,
            reason[:2000] or "-",
            via,
            json.dumps({"code": code, "why": why}),
        )
        await write_audit(
            conn,
            actor=actor,
            action=REFUSED.format(action=action),
            payout_id=payout_id,
            account_id=account_id,
            details={"command_id": command_id, "reason": reason, "why": why, "code": code},
        )
        return CommandVerdict.of_row(row)


def _check_command(command_id: str, payout_id: str, action: str, via: str) -> None:
    check_text(command_id, "command_id")
    check_payout_id(payout_id)
    if action not in ACTIONS:
        raise InvalidIdentifier(f"action must be one of {ACTIONS}, not {action!r}")
    if via not in VIAS:
        raise InvalidIdentifier(f"via must be one of {VIAS}, not {via!r}")
