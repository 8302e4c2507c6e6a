"""UNIT tests of the merged holder step's decisions (`execute_payout`), with a MOCK store and a
MOCK proxy: which writes it makes, that it submits at most once and only a payout it claimed
itself, that it releases the grant once the payout is terminal, and that a UC-01 step running
long enough to heartbeat is named in its heartbeat details. The real components run the same step in
tests/workflows/test_payout_integration_*.py. The lock server runs in-process over the FAKE
backend, for a real grant and a real release.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from activities import models as m
from activities.payout_activities import PayoutActivities
from ledger import Payout, PayoutState
from railproxy.client import SubmitResult
from railproxy.models import HandoffCertainty, Outcome
from tests.activities.test_claim_step_unit import MockStore, _activity_env, _step

S = PayoutState


class MergedStore(MockStore):
    """The claim store plus the writes after the submit."""

    async def _advance(self, name: str, token: int, to: PayoutState) -> Payout:
        self.calls.append((name, token))
        self._stamp(token)
        self.state = to
        return self._payout(to)

    async def mark_submitted_and_acked(
        self, payout_id: str, token: int, ctx: Any, *, grant: Any = None
    ) -> Payout:
        return await self._advance("mark_submitted_and_acked", token, S.RAIL_ACKED)

    async def ack_and_post(
        self, payout_id: str, token: int, ctx: Any, *, grant: Any = None
    ) -> Payout:
        return await self._advance("ack_and_post", token, S.POSTED)

    async def mark_submitted(
        self, payout_id: str, token: int, ctx: Any, *, grant: Any = None
    ) -> Payout:
        return await self._advance("mark_submitted", token, S.RAIL_SUBMITTED)

    async def mark_ambiguous(
        self, payout_id: str, token: int, ctx: Any, *, reason: str, grant: Any = None
    ) -> Payout:
        return await self._advance("mark_ambiguous", token, S.RAIL_AMBIGUOUS)

    async def post(self, payout_id: str, token: int, ctx: Any, *, grant: Any = None) -> Payout:
        return await self._advance("post", token, S.POSTED)


class CountingProxy:
    def __init__(
        self, outcome: Outcome = Outcome.ACKED, answer_when: Callable[[], bool] | None = None
    ) -> None:
        self.outcome = outcome
        self.submits: list[int] = []
        self.attempt_reads = 0
        self.answer_when = answer_when  # a slow rail: answers once this holds

    async def submit(self, req: Any) -> SubmitResult:
        self.submits.append(req.token)
        while self.answer_when is not None and not self.answer_when():
            await asyncio.sleep(0.01)
        return SubmitResult(
            handoff_certainty=HandoffCertainty.FINAL,
            http_status=200,
            outcome=self.outcome,
            attempt_id=1,
        )

    async def get_attempts(self, payout_id: str) -> list[Any]:
        self.attempt_reads += 1
        return []


async def _execute(
    store: MergedStore, proxy: CountingProxy, beats: list[Any] | None = None
) -> tuple[m.PayoutView, PayoutActivities, list[Any]]:
    beats = [] if beats is None else beats
    async with _step(store, proxy) as (acts, req):
        env = _activity_env()
        # The workflow's holder heartbeat timeout, short: the first heartbeat comes after half.
        env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.2))
        env.on_heartbeat = lambda *details: beats.extend(details)
        view = await env.run(acts.execute_payout, req)
        return view, acts, beats


async def test_unit_a_pending_payout_is_claimed_submitted_once_posted_and_released() -> None:
    beats: list[Any] = []

    def submit_named() -> bool:
        return any(isinstance(b, dict) and b["step"] == "submit" for b in beats)

    # A slow rail: the submit answers only once a heartbeat has named it.
    store, proxy = MergedStore(S.PENDING), CountingProxy(answer_when=submit_named)
    view, acts, beats = await _execute(store, proxy, beats)
    token = store.fence
    assert proxy.submits == [token]  # exactly one submission
    # One transaction for RAIL_SUBMITTED, RAIL_ACKED and the posting; no attempt read after the
    # fresh claim.
    assert store.calls == [("claim", token), ("ack_and_post", token)]
    assert proxy.attempt_reads == 0
    assert view.state == "POSTED" and view.released
    assert view.steps == ["claim", "submit", "post", "release"]
    assert not acts.grants  # the grant was given back inside the step
    # A step running past half the heartbeat timeout is named in its heartbeats (what the
    # Temporal UI shows while it runs); the quick claim before it sent none.
    named = [b["step"] for b in beats if isinstance(b, dict)]
    assert named[0] == "submit" and set(named) <= {"submit", "post", "release"}


async def test_unit_a_payout_found_claimed_is_not_submitted_but_handed_to_recovery() -> None:
    """Claimed by an earlier holder (whose submit may have reached the rail): no submit here,
    the attempt record is read as evidence and returned; the grant stays with the workflow."""
    store, proxy = MergedStore(S.CLAIMED), CountingProxy()
    view, acts, _ = await _execute(store, proxy)
    assert proxy.submits == []
    assert store.calls == [("claim", store.fence)]
    assert proxy.attempt_reads == 1
    assert view.state == "CLAIMED" and not view.released and view.steps == ["claim"]
    assert len(acts.grants) == 1


async def test_unit_an_unknown_outcome_is_ambiguous_and_keeps_the_grant() -> None:
    """No ack: RAIL_SUBMITTED then RAIL_AMBIGUOUS (never resubmitted), nothing posted, and the
    grant is left to the workflow, which releases it before resolving by lookups."""
    store, proxy = MergedStore(S.PENDING), CountingProxy(Outcome.UNKNOWN)
    view, _, _ = await _execute(store, proxy)
    token = store.fence
    assert proxy.submits == [token]
    assert store.calls == [("claim", token), ("mark_submitted", token), ("mark_ambiguous", token)]
    assert view.state == "RAIL_AMBIGUOUS" and not view.released
    assert view.steps == ["claim", "submit"]
