"""MOCK activities for orchestration tests of PayoutWorkflow: an in-memory stand-in for the lock
service, the payment database and the rail proxy. Used only where the point is the workflow's
decisions (which step, which queue, which token); the real activities are tested against the
real components elsewhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import models as m


@dataclass
class MockWorld:
    holder_queue: str
    state: str = "PENDING"
    funds_ok: bool = True
    next_token: int = 1
    # ack|decline|unknown|not_submitted|frozen; "ack_then_fail": the rail acknowledged and the
    # proxy recorded it, then the step failed before the payment database recorded anything.
    submit_script: list[str] = field(default_factory=lambda: ["ack"])
    lookup_script: list[str] = field(default_factory=lambda: ["settled"])
    # "unavailable" | "held" | "dead_queue" | "frozen" (never answers nor heartbeats, like a
    # SIGSTOPped worker whose open long-poll took the task)
    acquire_script: list[str] = field(default_factory=list)
    release_script: list[str] = field(default_factory=list)  # "frozen"
    claim_script: list[str] = field(default_factory=list)  # "fenced" | a state to report
    attempt: m.AttemptView | None = None
    calls: list[tuple[str, int]] = field(default_factory=list)
    # The merged holder activity's runs (token, the steps it reported); its inner steps are in
    # `calls` under their own names, as the separate activities record them.
    executes: list[tuple[int, list[str]]] = field(default_factory=list)
    rejected: list[m.SignalRejection] = field(default_factory=list)
    revokes: list[m.RevokeRequest] = field(default_factory=list)
    escalations: int = 0
    # Operator commands: what the MOCK payment store accepted, by
    # command id; the nonces it saw (a repeated nonce is refused as a replay); what it settled.
    accepted: dict[str, m.CommandRequest] = field(default_factory=dict)
    nonces: set[str] = field(default_factory=set)
    settled: list[m.CommandSettlement] = field(default_factory=list)
    # The abandon activity's last lookup of the rail: "settled" | "declined" | "absent" | "".
    abandon_evidence: str = ""
    # While set and not yet released, carry_out_revoke waits on it (a revoke in flight).
    revoke_gate: asyncio.Event | None = None
    # Outages: while set, these activities fail with a retryable error (an unreachable service).
    lock_service_down: bool = False  # carry_out_revoke
    lookup_failures: int = 0  # the next N lookup attempts fail
    escalate_failures: int = 0  # the next N escalate attempts fail
    failed_attempts: dict[str, int] = field(default_factory=dict)

    def fail(self, name: str, message: str) -> None:
        self.failed_attempts[name] = self.failed_attempts.get(name, 0) + 1
        raise ApplicationError(message, type="Unavailable")

    def view(self, **kw: Any) -> m.PayoutView:
        return m.PayoutView(
            payout_id="po-1",
            account_id="acct-1",
            state=kw.pop("state", self.state),
            amount=100,
            client_reference="ref-po-1",
            attempt=self.attempt,
            **kw,
        )

    def activities(self) -> list[Callable[..., Any]]:
        world = self

        @activity.defn(name=m.ACQUIRE_LOCK)
        async def acquire(req: m.AcquireRequest) -> m.AcquireResult:
            step = world.acquire_script.pop(0) if world.acquire_script else "ok"
            world.calls.append(("acquire:" + step, 0))
            if step == "frozen":
                await _frozen()
            if step == "unavailable":
                raise ApplicationError("lock service unreachable", type="BackendUnavailable")
            if step == "held":
                return m.AcquireResult(acquired=False, reason="timeout")
            token = world.next_token
            world.next_token += 1
            queue = "no-such-worker-queue" if step == "dead_queue" else world.holder_queue
            return m.AcquireResult(acquired=True, token=token, worker_queue=queue)

        async def claim(req: m.StepRequest) -> m.PayoutView:
            """The claim at the start of the merged step (no activity of its own)."""
            world.calls.append(("claim", req.token))
            step = world.claim_script.pop(0) if world.claim_script else ""
            if step == "fenced":
                raise ApplicationError("fenced", type=m.FENCED_OUT, non_retryable=True)
            if step:
                return world.view(state=step)  # what a state unknown to the workflow looks like
            if world.state == "PENDING":
                world.state = "CLAIMED" if world.funds_ok else "FAILED"
            return world.view()

        @activity.defn(name=m.SUBMIT_TO_RAIL)
        async def submit(req: m.StepRequest) -> m.PayoutView:
            world.calls.append(("submit", req.token))
            outcome = world.submit_script.pop(0)
            if outcome == "frozen":
                await _frozen()
            if outcome == "not_submitted":
                world.attempt = m.AttemptView(attempt_id="a", outcome="NOT_SUBMITTED")
                return world.view(detail="CIRCUIT_OPEN", handoff_certainty="NOT_SUBMITTED")
            if outcome == "ack_then_fail":
                world.attempt = m.AttemptView(attempt_id="a", outcome="ACKED")
                world.fail("submit", "payment database unreachable after the rail's ack")
            world.state = {"ack": "RAIL_ACKED", "decline": "FAILED", "unknown": "RAIL_AMBIGUOUS"}[
                outcome
            ]
            world.attempt = m.AttemptView(
                attempt_id="a",
                outcome={"ack": "ACKED", "decline": "DECLINED", "unknown": "UNKNOWN"}[outcome],
            )
            return world.view()

        @activity.defn(name=m.RECOVER_FROM_ATTEMPT)
        async def recover(req: m.StepRequest) -> m.PayoutView:
            world.calls.append(("recover", req.token))
            outcome = world.attempt.outcome if world.attempt else None
            world.state = {"ACKED": "RAIL_ACKED", "DECLINED": "FAILED"}.get(
                outcome or "", "RAIL_AMBIGUOUS"
            )
            return world.view()

        @activity.defn(name=m.POST_TO_LEDGER)
        async def post(req: m.StepRequest) -> m.PayoutView:
            world.calls.append(("post", req.token))
            world.state = "POSTED"
            return world.view()

        @activity.defn(name=m.RELEASE_LOCK)
        async def release(req: m.StepRequest) -> None:
            world.calls.append(("release", req.token))
            if world.release_script and world.release_script.pop(0) == "frozen":
                await _frozen()

        @activity.defn(name=m.EXECUTE_PAYOUT)
        async def execute(req: m.StepRequest) -> m.PayoutView:
            """The merged step as the real one decides: submit only a payout this run claimed
            from PENDING, post only after an ack, release only once terminal."""
            steps = ["claim"]
            before = world.state
            view = await claim(req)
            if before == "PENDING" and view.state == "CLAIMED":
                view = await submit(req)
                steps.append("submit")
                if view.state == "RAIL_ACKED":
                    view = await post(req)
                    steps.append("post")
            if view.state in ("POSTED", "FAILED", "ABANDONED"):
                await release(req)
                steps.append("release")
                view.released = True
            view.steps = steps
            world.executes.append((req.token, steps))
            return view

        @activity.defn(name=m.ACQUIRE_AND_EXECUTE)
        async def acquire_and_execute(req: m.RunRequest) -> m.RunResult:
            """The two-task path as the real one: the acquire, then the merged step under its
            grant, in one activity; a step's failure is answered with the grant's token."""
            grant = await acquire(req.acquire)
            if not grant.acquired:
                return m.RunResult(grant=grant)
            step = m.StepRequest(
                req.acquire.payout_id, req.acquire.account_id, grant.token, req.acquire.context
            )
            try:
                return m.RunResult(grant=grant, view=await execute(step))
            except ApplicationError as exc:
                failure = m.StepFailure(type=exc.type or "", message=str(exc))
                return m.RunResult(grant=grant, failure=failure)

        @activity.defn(name=m.LOOKUP_RAIL)
        async def lookup(req: m.LookupRequest) -> m.LookupResult:
            if world.lookup_failures > 0:
                world.lookup_failures -= 1
                world.fail("lookup", "rail proxy unreachable")
            status = world.lookup_script.pop(0) if world.lookup_script else "pending"
            world.calls.append(("lookup:" + status, 0))
            return m.LookupResult(status=status)

        @activity.defn(name=m.RESOLVE_AMBIGUOUS)
        async def resolve(req: m.StepRequest) -> m.PayoutView:
            world.calls.append(("resolve:" + req.resolution, req.token))
            world.state = "RAIL_ACKED" if req.resolution == "settled" else "FAILED"
            return world.view()

        @activity.defn(name=m.ABANDON_PAYOUT)
        async def abandon(req: m.StepRequest) -> m.PayoutView:
            if req.command_id and world.abandon_evidence:
                world.calls.append(("abandon_outranked:" + world.abandon_evidence, req.token))
                return world.view(evidence=world.abandon_evidence)
            world.calls.append(("abandon:" + req.operator, req.token))
            world.state = "ABANDONED"
            return world.view()

        @activity.defn(name=m.ACCEPT_OPERATOR_COMMAND)
        async def accept(req: m.CommandRequest) -> m.CommandVerdict:
            nonce = str((req.assertion or {}).get("nonce", req.command_id))
            world.calls.append((f"accept:{req.action}", 0))
            if req.command_id in world.accepted:
                return m.CommandVerdict(req.command_id, accepted=True, actor=req.operator)
            if nonce in world.nonces:
                return m.CommandVerdict(
                    req.command_id,
                    accepted=False,
                    outcome="refused",
                    code="replayed",
                    why="operator assertion already used",
                )
            world.nonces.add(nonce)
            world.accepted[req.command_id] = req
            return m.CommandVerdict(
                req.command_id,
                accepted=True,
                actor=f"verified:{req.operator}",
                reason=req.reason,
            )

        @activity.defn(name=m.SETTLE_OPERATOR_COMMAND)
        async def settle(req: m.CommandSettlement) -> m.CommandVerdict:
            world.settled.append(req)
            return m.CommandVerdict(req.command_id, accepted=True, outcome="refused", why=req.why)

        @activity.defn(name=m.CARRY_OUT_REVOKE)
        async def carry_out_revoke(req: m.RevokeRequest) -> m.CommandVerdict:
            if world.lock_service_down:
                world.fail("revoke", "lock service unreachable")
            if world.revoke_gate is not None:
                world.calls.append(("revoke_in_flight", 0))
                await world.revoke_gate.wait()
            world.revokes.append(req)
            world.calls.append(("revoke", 0))
            return m.CommandVerdict(
                req.command_id, accepted=True, outcome="carried_out", why="revoked"
            )

        @activity.defn(name=m.ESCALATE_AMBIGUOUS)
        async def escalate(req: m.StepRequest) -> None:
            if world.escalate_failures > 0:
                world.escalate_failures -= 1
                world.fail("escalate", "payment database unreachable")
            world.escalations += 1
            world.calls.append(("escalate", 0))

        @activity.defn(name=m.RECORD_SIGNAL_REJECTED)
        async def record_rejected(rej: m.SignalRejection) -> None:
            world.rejected.append(rej)

        return [
            acquire,
            acquire_and_execute,
            execute,
            submit,
            recover,
            post,
            release,
            lookup,
            resolve,
            abandon,
            escalate,
            record_rejected,
            accept,
            settle,
            carry_out_revoke,
        ]

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


async def _frozen() -> None:
    """A frozen worker's activity: no answer, no heartbeat, until the worker shuts down."""
    await asyncio.Event().wait()
