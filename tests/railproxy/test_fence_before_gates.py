"""A newer holder's token reaches both enforcement points whatever refuses it (issue 12 item 2,
INV-01, INV-05): the proxy raises the account's high-water mark before it answers any refusal (in
the attempt's transaction for an admitted request, issue 29), and the claim step stamps the
account's balance-row fence whatever state the payout is in.

Real PostgreSQL, a real rail proxy and rail stub over HTTP, the real payment-database store.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
import pytest

from common.db_roles import PAYDB
from common.migrate import migrate
from common.pgutil import create_database, create_pool, drop_database
from ledger import FencedOut, Payout, PayoutState, PayoutStore, WorkContext
from railproxy import HandoffCertainty
from railproxy.errors import (
    AdmissionFull,
    CircuitOpen,
    DeadlineExceeded,
    DuplicateSubmission,
    RateLimited,
    Rejected,
    StaleToken,
)
from railproxy.metrics import ProxyMetrics
from railproxy.service import RailProxy
from railproxy.settings import ProxySettings
from railproxy.startup import load_verifier
from tests.conftest import as_role
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, proxy_settings, submit_request
from tests.waiting import wait_for


@pytest.fixture(scope="module")
async def paydb_url(pg_server_url: str) -> AsyncIterator[str]:
    url = await create_database(pg_server_url, prefix="paydb_fence_t")
    await migrate(url, schemas={"paydb"})
    yield url
    await drop_database(pg_server_url, url)


@pytest.fixture
async def paydb(paydb_url: str) -> AsyncIterator[PayoutStore]:
    pool = await create_pool(as_role(paydb_url, PAYDB), min_size=1, max_size=4)
    yield PayoutStore(pool)
    await pool.close()


async def _high_token(rail_db: str, account_id: str) -> int | None:
    conn = await asyncpg.connect(rail_db)
    try:
        value = await conn.fetchval(
            "SELECT high_token FROM railproxy.account_fences WHERE account_id = $1", account_id
        )
    finally:
        await conn.close()
    return None if value is None else int(value)


async def test_t2_refused_by_open_breaker_still_fences_out_thawed_t1(
    paydb: PayoutStore, make_proxy: MakeProxy, stub: Stub, rail_db: str
) -> None:
    """T1 claims and freezes; T2 takes over, its claim step stamps the balance fence and its
    submit is refused by an OPEN breaker, yet the proxy's mark is T2; T1 thaws and is refused by
    the proxy's FENCE (not the attempt guard, not the breaker) and by the payment database."""
    ctx = WorkContext(correlation_id=f"corr-{uuid.uuid4().hex[:8]}", actor="test")
    account = f"acct-{uuid.uuid4().hex[:10]}"
    await paydb.create_account(account, ctx)
    await paydb.fund_account(account, 10_000, ctx)
    payout = await paydb.create_payout(f"po-{uuid.uuid4().hex[:10]}", account, 1_000, ctx)
    t1, t2 = 41, 42

    def submit(token: int) -> Any:
        return submit_request(
            payout_id=payout.payout_id,
            account_id=account,
            amount=payout.amount,
            reference=payout.client_reference,
            token=token,
        )

    # T1's claim step, then T1 freezes (its submit simply does not run yet).
    claimed = await paydb.claim(payout.payout_id, t1, ctx)
    assert isinstance(claimed, Payout) and claimed.state == PayoutState.CLAIMED

    # The rail goes down and the proxy's breaker opens (no payout of this account involved).
    proxy = await make_proxy(breaker_open_s=60.0)
    await stub.set(outage=True)
    for _ in range(proxy.settings.breaker_min_samples):
        await proxy.client.submit(submit_request())
    await wait_for(lambda: _circuit_is(proxy.health, "OPEN"))

    # T2 takes over. Its claim step finds the payout CLAIMED (not PENDING) and stamps the fence.
    await paydb.stamp_account_fence(payout.payout_id, t2)
    assert await proxy.client.get_attempts(payout.payout_id) == []  # recovery: safe to submit
    refused = await proxy.client.submit(submit(t2))
    assert refused.code == "CIRCUIT_OPEN"
    assert refused.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert await _high_token(rail_db, account) == t2  # the gate refused, the fence took T2

    # T1 thaws and submits: the proxy's fence refuses it, although the breaker would too.
    stale = await proxy.client.submit(submit(t1))
    assert stale.code == "STALE_TOKEN", stale
    assert stale.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert (stale.presented_token, stale.highest_token) == (t1, t2)
    # ... and so does the payment database: the balance row carries T2, although the payout
    # row still carries T1 (T2 has not written it).
    with pytest.raises(FencedOut) as fenced:
        await paydb.mark_submitted(payout.payout_id, t1, ctx)
    assert fenced.value.stored_token == t2
    assert (await paydb.get_payout(payout.payout_id)).fence == t1

    assert await proxy.client.get_attempts(payout.payout_id) == []
    assert await stub.movements(payout.client_reference) == []
    assert payout.client_reference not in await stub.counts()


async def test_claim_step_stamp_is_fenced_and_keeps_the_payout(paydb: PayoutStore) -> None:
    """The stamp accepts T >= fence (equal: the same grant), refuses a lower token as FencedOut,
    and never changes the payout row, whatever its state."""
    ctx = WorkContext(correlation_id="corr-stamp", actor="test")
    account = f"acct-{uuid.uuid4().hex[:10]}"
    await paydb.create_account(account, ctx)
    await paydb.fund_account(account, 5_000, ctx)
    payout = await paydb.create_payout(f"po-{uuid.uuid4().hex[:10]}", account, 500, ctx)
    await paydb.claim(payout.payout_id, 7, ctx)
    await paydb.stamp_account_fence(payout.payout_id, 9)
    await paydb.stamp_account_fence(payout.payout_id, 9)
    with pytest.raises(FencedOut) as fenced:
        await paydb.stamp_account_fence(payout.payout_id, 8)
    assert (fenced.value.presented_token, fenced.value.stored_token) == (8, 9)
    after = await paydb.get_payout(payout.payout_id)
    assert (after.state, after.fence) == (PayoutState.CLAIMED, 7)
    with pytest.raises(FencedOut):
        await paydb.claim(payout.payout_id, 8, ctx)  # the claim path sees the same fence


async def _circuit_is(health: Callable[[], Awaitable[dict[str, Any]]], state: str) -> bool:
    reached: bool = (await health())["circuit_state"] == state
    return reached


# ---------------------------------------------------------------- each gate, in the service


Gate = Callable[[RailProxy], AbstractAsyncContextManager[None]]


@asynccontextmanager
async def _deadline_passed(_proxy: RailProxy) -> AsyncIterator[None]:
    yield  # the request itself carries a deadline in the past (see `_request`)


@asynccontextmanager
async def _rate_limited(proxy: RailProxy) -> AsyncIterator[None]:
    proxy.bucket.tokens = 0.0
    proxy.bucket.rate = 1e-9  # nothing refills during the test
    yield


@asynccontextmanager
async def _breaker_open(proxy: RailProxy) -> AsyncIterator[None]:
    for _ in range(proxy.settings.breaker_min_samples):
        proxy.breaker.record(False)
    yield


@asynccontextmanager
async def _bulkhead_full(proxy: RailProxy) -> AsyncIterator[None]:
    async with proxy.bulkhead.slot(wait_s=1.0):  # max_concurrency=1, max_queue=0: now full
        yield


@asynccontextmanager
async def _shared_slots_busy(proxy: RailProxy) -> AsyncIterator[None]:
    # The Connection's one slot, held as another replica would hold it (railproxy.budget).
    async with proxy.submit_budget.lease(wait_s=0):
        yield


GATES: dict[str, tuple[Gate, type[Rejected]]] = {
    "deadline": (_deadline_passed, DeadlineExceeded),
    "rate_limit": (_rate_limited, RateLimited),
    "breaker": (_breaker_open, CircuitOpen),
    "bulkhead": (_bulkhead_full, AdmissionFull),
    "shared_budget": (_shared_slots_busy, AdmissionFull),
}


@pytest.mark.parametrize("gate", sorted(GATES))
async def test_lower_token_is_refused_by_the_fence_before_a_refusing_gate(
    gate: str, rail_db: str, stub: Stub
) -> None:
    """With a gate that refuses everything, a lower token is still told STALE_TOKEN (the fence
    runs first), and a higher token is refused by the gate but raises the mark all the same."""
    settings = proxy_settings(rail_db, stub.url, max_concurrency=1, max_queue=0, db_pool_max=2)
    account = f"a-{uuid.uuid4().hex[:10]}"
    open_gate, refusal = GATES[gate]
    # A refused shared slot is waited for until the queue deadline: keep that wait short.
    late = {"deadline": -1.0, "shared_budget": 1.0}.get(gate, 5.0)
    async with _service(settings) as proxy:
        first = await proxy.submit(submit_request(account_id=account, token=5))
        assert first.token == 5  # recorded and forwarded while the gate was open
        async with open_gate(proxy):
            with pytest.raises(StaleToken) as stale:
                await proxy.submit(submit_request(account_id=account, token=4, deadline_s=late))
            assert (stale.value.presented_token, stale.value.highest_token) == (4, 5)
            with pytest.raises(refusal):
                await proxy.submit(submit_request(account_id=account, token=6, deadline_s=late))
        assert await _high_token(rail_db, account) == 6
    await stub.assert_no_duplicates()


async def test_a_refusal_inside_the_attempt_transaction_still_raises_the_mark(
    rail_db: str, stub: Stub
) -> None:
    """The attempt guard refuses a second submit of a payout inside the attempt's transaction,
    which rolls back the fence it raised there: the refusal still leaves the newer token as the
    account's mark (raised in its own transaction before the answer), so a token between the
    two is then STALE_TOKEN. An admitted request needs no transaction of its own for the fence:
    its attempt's transaction raised it."""
    account, payout_id = f"a-{uuid.uuid4().hex[:10]}", f"p-{uuid.uuid4().hex[:10]}"
    async with _service(proxy_settings(rail_db, stub.url)) as proxy:
        first = await proxy.submit(submit_request(account_id=account, payout_id=payout_id, token=5))
        assert first.token == 5 and await _high_token(rail_db, account) == 5
        with pytest.raises(DuplicateSubmission):
            await proxy.submit(submit_request(account_id=account, payout_id=payout_id, token=7))
        assert await _high_token(rail_db, account) == 7
        with pytest.raises(StaleToken) as stale:
            await proxy.submit(submit_request(account_id=account, token=6))
        assert (stale.value.presented_token, stale.value.highest_token) == (6, 7)
    await stub.assert_no_duplicates()


@asynccontextmanager
async def _service(settings: ProxySettings) -> AsyncIterator[RailProxy]:
    """The proxy's service in this process, provisioned as the app's lifespan does first."""
    pool = await create_pool(settings.database_url, min_size=1, max_size=2)
    proxy = RailProxy(settings, pool, ProxyMetrics(), load_verifier(settings))
    try:
        await proxy.provision()
        yield proxy
    finally:
        await proxy.close()
        await pool.close()
