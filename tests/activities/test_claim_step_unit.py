"""UNIT tests of the claim step's decisions (the start of `execute_payout`), with a MOCK store and
a MOCK proxy: what is under test is which fenced write the step makes in each payout state. The store's
statements themselves are tested against real PostgreSQL (tests/railproxy/test_fence_before_gates.py,
tests/ledger/). The lock server runs in-process over the FAKE backend, for a real grant.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import models as m
from activities.payout_activities import PayoutActivities
from ledger import AlreadyAdvanced, FencedOut, Payout, PayoutState
from lockservice.sdk import LockClient
from lockservice.server import create_app
from railproxy.client import SubmitResult
from railproxy.models import HandoffCertainty
from tests.lockservice.fake_backend import FakeBackend

S = PayoutState
_NOW = datetime.now(UTC)


@dataclass
class MockStore:
    """Records the fenced writes; `fence` plays the balance row's stored fence."""

    state: PayoutState
    fence: int = 0
    calls: list[tuple[str, int]] = field(default_factory=list)
    grants: list[Any] = field(default_factory=list)  # the signed grant each write presented

    def _payout(self, state: PayoutState) -> Payout:
        return Payout(
            payout_id="p1",
            account_id="acct-1",
            amount=100,
            state=state,
            fence=self.fence,
            client_reference="p1",
            failure_reason=None,
            ledger_group_id=None,
            created_at=_NOW,
            updated_at=_NOW,
        )

    async def get_payout(self, payout_id: str) -> Payout:
        return self._payout(self.state)

    def _stamp(self, token: int) -> None:
        if token < self.fence:
            raise FencedOut("payout:acct-1", token, self.fence)
        self.fence = token

    async def claim(
        self, payout_id: str, token: int, ctx: Any, *, grant: Any = None
    ) -> Payout | AlreadyAdvanced:
        """As the real claim: the account's fence is stamped in every state, only a PENDING
        payout moves, and one past PENDING is AlreadyAdvanced."""
        self.calls.append(("claim", token))
        self.grants.append(grant)
        self._stamp(token)
        if self.state is not S.PENDING:
            return AlreadyAdvanced(payout_id=payout_id, state=self.state, fence=self.fence)
        self.state = S.CLAIMED
        return self._payout(S.CLAIMED)


class MockProxy:
    async def get_attempts(self, payout_id: str) -> list[Any]:
        return []


class NotSubmittingProxy(MockProxy):
    """A proxy that hands nothing off (circuit open): the step ends after the claim."""

    async def submit(self, req: Any) -> SubmitResult:
        return SubmitResult(
            handoff_certainty=HandoffCertainty.NOT_SUBMITTED, http_status=503, code="CIRCUIT_OPEN"
        )


def _activity_env() -> ActivityEnvironment:
    """An activity context whose attempt has just started (so the acquire is not 'late')."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        ActivityEnvironment.default_info(),
        started_time=datetime.now(UTC),
        start_to_close_timeout=timedelta(seconds=35),
    )
    return env


@contextlib.asynccontextmanager
async def _step(
    store: MockStore, proxy: object | None = None
) -> AsyncIterator[tuple[PayoutActivities, m.StepRequest]]:
    """The activities over `store` and `proxy` (default: one with no attempts), and a grant."""
    transport = httpx.ASGITransport(app=create_app(FakeBackend()))
    async with LockClient("http://lock", transport=transport) as locks:
        acts = PayoutActivities(
            locks=locks,
            store=cast(Any, store),
            proxy=cast(Any, MockProxy() if proxy is None else proxy),
            worker_queue="q-holder-test",
            worker_id="test",
            lock_url="http://lock",
        )
        ctx = m.WorkContext(correlation_id="c")
        got = await _activity_env().run(
            acts.acquire_lock, m.AcquireRequest("p1", "acct-1", 0.0, ctx)
        )
        assert got.acquired
        yield acts, m.StepRequest(payout_id="p1", account_id="acct-1", token=got.token, context=ctx)


async def test_unit_pending_payout_is_claimed_which_stamps_the_fence() -> None:
    """A PENDING payout is claimed (the claim stamps the balance fence in its transaction)."""
    store = MockStore(S.PENDING)
    async with _step(store, NotSubmittingProxy()) as (acts, req):
        view = await _activity_env().run(acts.execute_payout, req)
    assert store.calls == [("claim", req.token)]
    assert view.state == "CLAIMED" and view.steps == ["claim", "submit"]
    # The write presented the lease's signed grant (what the real store verifies).
    [grant] = store.grants
    assert (grant.key, grant.token) == ("payout:acct-1", req.token) and grant.signature


@pytest.mark.parametrize(
    "state",
    [s for s in PayoutState if s is not S.PENDING],
    ids=str,
)
async def test_unit_payout_in_any_other_state_gets_the_account_fence_stamped(
    state: PayoutState,
) -> None:
    """Whatever state a newer holder finds (it only recovers, posts, or finds it finished), its
    claim stamps the account's balance fence with its token and changes nothing else."""
    store = MockStore(state)
    async with _step(store) as (acts, req):
        view = await _activity_env().run(acts.execute_payout, req)
    assert store.calls == [("claim", req.token)]
    assert store.fence == req.token
    assert view.state == str(state)


async def test_unit_stamp_refused_is_fenced_out_and_never_retried() -> None:
    """A lower token than the account's fence aborts the grant: non-retryable FENCED_OUT."""
    store = MockStore(S.RAIL_SUBMITTED, fence=10**9)
    async with _step(store) as (acts, req):
        with pytest.raises(ApplicationError) as err:
            await _activity_env().run(acts.execute_payout, req)
    assert err.value.type == m.FENCED_OUT and err.value.non_retryable
