"""The operator's desk of one PayoutWorkflow: every command a person sends it (abandon, revoke,
as a signal or as an Update; a cancellation request from the UI or CLI), judged on its own.

Rules (docs/workflow.md, "Operator commands"):
- Anything can arrive: any signal name, any number of arguments, any payload bytes. What the
  desk cannot use becomes an audited rejection (`signal_rejected:<name>`); nothing raises, so no
  sender can wedge the workflow.
- A command the payout's state allows is verified once, by the payment store
  (`accept_operator_command`): the operator assertion's signature, action, payout, lock key and
  expiry, and its nonce, which the store records so that an assertion authorises one command,
  once (a replay is refused as `replayed`). The audited actor is the identity inside it.
- A pending command is never replaced: a second abandon while one is being verified or waits
  for a grant is refused on its own. Every command ends carried out or refused, once, with one
  audit row.
- Evidence outranks any command: an abandon is refused when a rail outcome is known
  (`Facts.evidence`), and the abandon activity looks at the rail once more before it acts.

Accepted revokes are carried out by the run's revoke coroutine, `workflows.operator_revokes`.
Deterministic workflow code: imported by `workflows.payout_state` inside the sandbox; no I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from temporalio.converter import value_to_type

    from activities import models as m
    from activities.payout_activities import PayoutActivities
    from ledger.states import TERMINAL_STATES, PayoutState

__all__ = [
    "ACTIONS",
    "AUDIT_TIMEOUT",
    "Facts",
    "OperatorDesk",
    "cause",
    "decode_signal",
    "missing_identity",
    "operator_command",
]

#: The commands a payout workflow takes; any other signal name is refused (and audited).
ACTIONS = ("abandon", "revoke")
#: Ended commands kept in the status query and carried to the next run (all are in the
#: payment database's `operator_commands`); pending ones are always carried.
_CARRIED_ENDED = 50
#: The fields an operator command may carry; anything else makes it invalid.
_COMMAND_FIELDS = frozenset(f.name for f in dataclasses.fields(m.OperatorCommand))
AUDIT_TIMEOUT = timedelta(seconds=30)


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the desk needs to know of the payout when it judges a command."""

    state: str
    escalated: bool
    resolution: str  # "settled" / "absent" once the rail's evidence is known, else ""
    evidence: str  # what the rail said, for the refusal's wording


class OperatorDesk:
    """Commands received, verified, queued and ended, for one run of one payout workflow."""

    def __init__(
        self,
        inp: m.PayoutInput,
        facts: Callable[[], Facts],
        retry: RetryPolicy,
        carried: Sequence[m.CommandRecord] = (),
        rejections: list[m.SignalRejection] | None = None,
    ) -> None:
        self._input = inp
        self._facts = facts
        self._retry = retry  # reads, audits, revokes: no attempt limit (an outage only delays)
        self._records: list[m.CommandRecord] = list(carried)
        self._count = 0  # commands received by this run: part of each command id
        self._cancel_audits: list[asyncio.Task[None]] = []
        self.cancel_requests = 0
        # The status query's `rejected_signals`: the workflow's own list, shared (it also holds
        # the rejections carried from the previous run).
        self.rejections: list[m.SignalRejection] = [] if rejections is None else rejections

    # ------------------------------------------------------------------ what the desk holds

    def records(self) -> list[m.CommandRecord]:
        """For the status query: every command this run knows, assertions left out."""
        return [dataclasses.replace(r, assertion=None) for r in self._records]

    def carry(self) -> list[m.CommandRecord]:
        """For the next run: every pending command, and the latest ended ones."""
        ended = [r for r in self._records if r.status in ("carried_out", "refused")]
        keep = {id(r) for r in ended[-_CARRIED_ENDED:]}
        return [r for r in self._records if r.status in ("verifying", "pending") or id(r) in keep]

    def pending_abandon(self) -> m.CommandRecord | None:
        """The accepted abandon waiting for a grant, if any."""
        return next((r for r in self._abandons() if r.status == "pending"), None)

    def pending_revokes(self) -> int:
        return len(self.pending("revoke"))

    def pending(self, action: str) -> list[m.CommandRecord]:
        """The accepted commands of `action` waiting to be carried out, oldest first."""
        return [r for r in self._records if r.action == action and r.status == "pending"]

    def next_revoke(self) -> m.CommandRecord | None:
        """The accepted revoke to carry out next (`workflows.operator_revokes`), if any."""
        return next(iter(self.pending("revoke")), None)

    def _abandons(self) -> list[m.CommandRecord]:
        return [r for r in self._records if r.action == "abandon"]

    # ------------------------------------------------------------------ receiving

    async def on_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any signal, any arity, any payload: a command, or an audited rejection. Never raises."""
        payload, why = decode_signal(args)
        if not why and name not in ACTIONS:
            why = f"unknown signal {name[:100]!r}: a payout workflow takes {', '.join(ACTIONS)}"
        cmd, bad = (m.OperatorCommand(), why) if why else operator_command(payload)
        if bad:
            signal = name[:100] or "unnamed"
            self._note_rejection(signal, cmd, bad)
            await self._audit_rejection(signal, cmd, bad)
            return
        await self.receive(name, cmd, via="signal")

    def refusal(
        self, action: str, cmd: m.OperatorCommand, itself: m.CommandRecord | None = None
    ) -> str:
        """Why `cmd` cannot be accepted now ("" if it may be: its assertion is checked next).
        `itself`: the command's own record, when it is judged again after verification."""
        why = missing_identity(cmd)
        f = self._facts()
        if not why and f.state in TERMINAL_STATES:
            why = f"payout is terminal ({f.state}); nothing to {action}"
        if not why and action == "abandon":
            why = self._abandon_refusal(f, itself)
        return why

    def _abandon_refusal(self, f: Facts, itself: m.CommandRecord | None) -> str:
        if f.resolution:
            return (
                f"the rail's evidence decides this payout: {f.evidence or f.resolution}; it will "
                "be applied, and an abandon cannot override it"
            )
        if f.state != PayoutState.RAIL_AMBIGUOUS.value:
            return f"abandon is only valid in RAIL_AMBIGUOUS, payout is {f.state}"
        if not f.escalated:
            return "abandon is only valid after the resolution SLA has escalated"
        for r in self._abandons():
            if r.status in ("verifying", "pending") and r is not itself:
                return (
                    f"abandon {r.command_id} by {r.actor or r.operator} is already {r.status}; "
                    "each command is judged on its own and none replaces another"
                )
        return ""

    async def receive(self, action: str, cmd: m.OperatorCommand, via: str) -> m.CommandRecord:
        """Judge one command: refuse it, or have the payment store verify and record it and
        queue it (abandon: for the next grant; revoke: for the revoke coroutine)."""
        self._count += 1
        record = m.CommandRecord(
            command_id=f"{workflow.info().run_id}:{self._count}",
            action=action,
            via=via,
            operator=str(cmd.operator)[:200],
            reason=str(cmd.reason)[:2000],
            at=_now(),
            assertion=cmd.assertion if isinstance(cmd.assertion, dict) else None,
        )
        self._records.append(record)
        why = self.refusal(action, cmd, itself=record)
        if why:
            self._end(record, "refused", why)
            await self._audit_rejection(action, cmd, why)
            return record
        verdict = await self._verify(record)
        if verdict.outcome == "refused" or not verdict.accepted:
            self._end(record, "refused", verdict.why or "refused by the payment store")
            return record  # the store recorded the refusal and its audit row
        record.actor = verdict.actor
        # Judged again: the payout may have moved on while the store verified it (a lookup
        # found the rail's evidence, the payout ended).
        record.status = "pending"
        again = self.refusal(action, cmd, itself=record)
        if again:
            await self.refuse(record, again, code="overtaken")
        return record

    def validate(self, action: str, cmd: m.OperatorCommand) -> None:
        """The Update validator: refuse before anything enters the history (ValueError)."""
        why = self.refusal(action, cmd)
        if why:
            raise ValueError(why)

    async def on_update(self, action: str, cmd: m.OperatorCommand) -> m.CommandRecord:
        """An Update: the verdict goes back to the caller; a refusal fails the update (its
        type `OperatorCommandRefused`), never the workflow."""
        record = await self.receive(action, cmd, via="update")
        if record.status == "refused":
            raise ApplicationError(
                record.why, record.command_id, type=m.COMMAND_REFUSED, non_retryable=True
            )
        return dataclasses.replace(record, assertion=None)

    def cancel_requested(self) -> None:
        """A cancellation request (UI "Request Cancellation", `temporal workflow cancel`): a
        payout workflow is never cancelled, whatever state it is in. Recorded and audited; the
        audit runs in a task of its own (awaited by `settle_audits`), because this is called
        from the workflow's primary task, which must keep waiting on the payout's own."""
        self.cancel_requests += 1
        why = (
            "a payout workflow is never cancelled: the payout goes on to a terminal state by "
            "evidence; an ambiguous one past its SLA can be abandoned (payouts payout abandon)"
        )
        claim = m.OperatorCommand(operator="cancel-request", reason="workflow cancellation")
        self._note_rejection("cancel", claim, why)
        self._cancel_audits.append(asyncio.create_task(self._audit_rejection("cancel", claim, why)))

    async def settle_audits(self) -> None:
        """Wait for the audits of cancellation requests (before the run ends or continues)."""
        while self._cancel_audits:
            await self._cancel_audits.pop(0)

    # ------------------------------------------------------------------ ending commands

    def carried_out(self, record: m.CommandRecord, what: str) -> None:
        self._end(record, "carried_out", what)

    def refused(self, record: m.CommandRecord, why: str) -> None:
        """End a command the payment store refused itself (the store wrote its audit row)."""
        self._end(record, "refused", why)

    async def refuse(self, record: m.CommandRecord, why: str, code: str) -> None:
        """End an accepted command that will not be carried out: its one audit row."""
        self._end(record, "refused", why)
        try:
            await workflow.execute_activity_method(
                PayoutActivities.settle_operator_command,
                m.CommandSettlement(
                    command_id=record.command_id,
                    payout_id=self._input.payout_id,
                    why=why[:2000],
                    code=code,
                ),
                start_to_close_timeout=AUDIT_TIMEOUT,
                retry_policy=self._retry,
            )
        except ActivityError as err:
            record.why = f"{why} (not recorded: {cause(err)})"

    def _end(self, record: m.CommandRecord, status: str, why: str) -> None:
        record.status, record.why, record.at = status, why, _now()
        record.assertion = None  # no longer needed: nothing will present it again
        if status == "refused":
            cmd = m.OperatorCommand(operator=record.operator, reason=record.reason)
            self._note_rejection(record.action, cmd, why)

    def _note_rejection(self, signal: str, cmd: m.OperatorCommand, why: str) -> None:
        """The status query's `rejected_signals` (all of them are in the audit log)."""
        self.rejections.append(
            m.SignalRejection(
                signal=signal,
                operator=str(cmd.operator)[:200],
                reason=str(cmd.reason)[:2000],
                why=why,
            )
        )

    async def _verify(self, record: m.CommandRecord) -> m.CommandVerdict:
        try:
            verdict: m.CommandVerdict = await workflow.execute_activity_method(
                PayoutActivities.accept_operator_command,
                m.CommandRequest(
                    command_id=record.command_id,
                    payout_id=self._input.payout_id,
                    account_id=self._input.account_id,
                    action=record.action,
                    via=record.via,
                    operator=record.operator,
                    reason=record.reason,
                    assertion=record.assertion,
                ),
                start_to_close_timeout=AUDIT_TIMEOUT,
                retry_policy=self._retry,
            )
        except ActivityError as err:
            # Only a non-retryable failure gets here (the store could not judge it at all).
            why = f"the command could not be verified: {cause(err)}"
            cmd = m.OperatorCommand(operator=record.operator, reason=record.reason)
            await self._audit_rejection(record.action, cmd, why)
            return m.CommandVerdict(command_id=record.command_id, accepted=False, why=why)
        return verdict

    async def _audit_rejection(self, signal: str, cmd: m.OperatorCommand, why: str) -> None:
        """A command refused before the payment store saw it: audited like any operator action
        (FR-30), retried until the database takes it; a failure is reported, never raised."""
        rejection = m.SignalRejection(
            signal=signal, operator=str(cmd.operator)[:200], reason=str(cmd.reason)[:2000], why=why
        )
        workflow.logger.warning("operator command rejected: %s (%s)", signal, why)
        try:
            await workflow.execute_activity_method(
                PayoutActivities.record_signal_rejected,
                rejection,
                start_to_close_timeout=AUDIT_TIMEOUT,
                retry_policy=self._retry,
            )
        except ActivityError as err:
            workflow.logger.error("could not audit the rejected %s: %s", signal, cause(err))


# ---------------------------------------------------------------------- decoding


def decode_signal(args: Sequence[RawValue]) -> tuple[Any, str]:
    """(payload, why-not): a signal's raw arguments, decoded by this workflow's converter."""
    if len(args) != 1:
        return None, f"invalid payload: one operator command expected, got {len(args)} arguments"
    payload = args[0].payload
    try:
        return workflow.payload_converter().from_payload(payload), ""
    except Exception as exc:  # any bytes can arrive: nothing a sender sends may raise here
        encoding = payload.metadata.get("encoding", b"").decode("utf-8", "replace")[:50]
        return None, f"invalid payload: not decodable (encoding {encoding!r}): {exc}"[:500]


def operator_command(payload: Any) -> tuple[m.OperatorCommand, str]:
    """Decode a command's payload; the second value says why it is refused ("" when valid)."""
    if isinstance(payload, m.OperatorCommand):
        return payload, missing_identity(payload)
    unexpected = (
        sorted(map(str, set(payload) - _COMMAND_FIELDS)) if isinstance(payload, dict) else []
    )
    if unexpected:
        # A misspelt field ("reson") must not be dropped silently: refuse the whole command.
        return m.OperatorCommand(), f"invalid payload: unexpected field(s) {unexpected}"[:500]
    try:
        cmd = value_to_type(m.OperatorCommand, payload if payload is not None else {})
    except (TypeError, ValueError, AttributeError) as exc:
        return m.OperatorCommand(), f"invalid payload: {exc}"[:500]
    if cmd.assertion is not None and not isinstance(cmd.assertion, dict):
        return m.OperatorCommand(), "invalid payload: assertion must be an object"
    return cmd, missing_identity(cmd)


def missing_identity(cmd: m.OperatorCommand) -> str:
    if not isinstance(cmd.operator, str) or not cmd.operator.strip():
        return "an operator identity is required"
    if not isinstance(cmd.reason, str) or not cmd.reason.strip():
        return "a reason is required"
    return ""


def cause(err: BaseException) -> str:
    inner = err.__cause__ or getattr(err, "cause", None)
    return f"{type(inner).__name__}: {inner}" if inner else str(err)


def _now() -> str:
    return workflow.now().isoformat()
