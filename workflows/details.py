"""What the Temporal UI shows of a payout at a glance, beside its static summary (set by the
starter, `activities.redrive.start_payout`): its current details (`workflow.set_current_details`,
refreshed whenever what the workflow knows changes): state, amount, the step it is at, the last
lookup, a known resolution, the escalation, why it FAILED, and the operator commands with their
verdicts.

A payout that ends FAILED ends its workflow COMPLETED (the workflow did its job: the payout is
decided, by evidence); the details say FAILED and why, in words. Pure functions: safe in
workflow code.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities import models as m

#: Failure reasons as the payment database records them, in words.
_FAILURES = {
    "insufficient_funds": "insufficient funds (never sent to the rail)",
    "declined_by_rail": "declined by the rail",
    "absent_at_rail": "absent at the rail (the rail's complete view shows no such payment)",
}


@dataclass(frozen=True)
class Snapshot:
    payout_id: str
    account_id: str
    amount: int
    state: str
    step: str
    token: int
    escalated: bool
    resolution: str
    evidence: str
    failure_reason: str | None
    lookups: int
    last_lookup: m.LookupRecord | None
    commands: list[m.CommandRecord]
    cancel_requests: int
    last_error: str


def current_details(s: Snapshot) -> str:
    """Markdown, a few lines: the first says the state in bold, the payout and the amount."""
    lines = [
        f"**{s.state}** · payout `{s.payout_id}` · account `{s.account_id}` · "
        f"amount {s.amount or '?'}"
    ]
    if s.state == "FAILED":
        why = _FAILURES.get(s.failure_reason or "", s.failure_reason or "reason not recorded")
        lines.append(f"- failed: {why}")
    elif s.state == "ABANDONED":
        lines.append(f"- abandoned by an operator: {s.failure_reason or ''}".rstrip(": "))
    elif s.state != "POSTED":
        lines.append(f"- step: {s.step or 'starting'}" + (f" (token {s.token})" if s.token else ""))
    if s.lookups:
        last = s.last_lookup
        seen = f"; last #{last.number} at {last.at[:19]}: {last.status}" if last else ""
        lines.append(f"- lookups: {s.lookups}{seen}")
    if s.resolution:
        lines.append(
            f"- rail's evidence: {s.evidence or s.resolution}; applied under the next grant"
        )
    if s.escalated and s.state == "RAIL_AMBIGUOUS":
        lines.append("- escalated: the resolution SLA passed; an operator may abandon")
    pending = [c for c in s.commands if c.status in ("verifying", "pending")]
    ended = [c for c in s.commands if c.status in ("carried_out", "refused")]
    for c in pending:
        lines.append(f"- {c.action} {c.status} ({c.actor or c.operator})")
    if ended:
        done = sum(1 for c in ended if c.status == "carried_out")
        lines.append(f"- commands: {done} carried out, {len(ended) - done} refused")
    if s.cancel_requests:
        lines.append(f"- cancellation requests refused: {s.cancel_requests}")
    if s.last_error and s.state not in ("POSTED", "FAILED", "ABANDONED"):
        lines.append(f"- last error: {s.last_error[:200]}")
    return "  \n".join(lines)
