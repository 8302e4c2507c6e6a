"""INV-10's blocked-account rule on the real system (issue 24 item 6), negative controls by
construction: a live session keeps the grant of a payout that has ended (the release that never
came), on the PostgreSQL backend's tables and through a real lock server over etcd with the
real SDK. The checker reports the account once the grant has gone unused past the bound, and
stops as soon as the grant is released; a grant whose session expired is not a holding."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from invariants.checker import (
    InvariantReport,
    lock_server_grant_source,
    lock_server_hold_source,
)
from lockservice.api import Grant
from lockservice.sdk import LockClient
from lockservice.server import create_app, create_backend
from tests.invariants.conftest import World, lock_key, sample_of, violated
from tests.lockservice.server_fixtures import serve_app

#: A bound a test can wait out: the rule is the same, only the threshold is shorter.
SHORT_BOUND_S = 1.0


async def _check_until_blocked(world: World, **kw: object) -> InvariantReport:
    """Check until the grant has been unused for longer than SHORT_BOUND_S (a condition, polled
    with a generous bound on a loaded machine)."""
    deadline = time.monotonic() + 60
    while True:
        report = await world.check(hold_bound_s=SHORT_BOUND_S, **kw)  # type: ignore[arg-type]
        if report.counts()["INV-10"] or time.monotonic() > deadline:
            return report
        await asyncio.sleep(0.2)


async def _pay_and_keep(world: World, account_id: str) -> Grant:
    """UC-01 under a real grant of world's live session, without the release at the end."""
    payout_id = await world.new_payout(account_id, 1000)
    g = await world.grant(account_id)
    await world.store.claim(payout_id, g.token, world.ctx)
    await world.store.mark_submitted(payout_id, g.token, world.ctx)
    assert await world.submit(payout_id, account_id, 1000, g.token) == "ACKED"
    await world.store.mark_acked(payout_id, g.token, world.ctx)
    await world.store.post(payout_id, g.token, world.ctx)
    return g


async def test_inv10_a_grant_kept_after_its_payout_posted_blocks_the_account(world: World) -> None:
    """The payout is POSTED and its grant is still held by a live session: within the bound
    that is a critical section finishing, past it the account is blocked (INV-10 only), and the
    account's next payout is counted as waiting. Released, the report is clean again."""
    a = await world.account()
    await world.pay(a, 500)  # an earlier payout, released as usual: not a holding
    kept = await _pay_and_keep(world, a)
    token = kept.token
    await world.new_payout(a, 700)  # waits behind the kept grant
    fresh = await world.check()  # the default bound (90 s): just used, so in flight
    assert fresh.ok and fresh.checked["held_payout_locks"] == 1, fresh.as_dict()
    report = await _check_until_blocked(world)
    assert violated(report) == {"INV-10"}
    [only] = sample_of(report, "INV-10")
    assert only.startswith(f"account {a} blocked: {lock_key(a)} held under token={token}")
    assert only.endswith("1 payout(s) of the account not terminal")
    held = await world.locks.inspect(lock_key(a))
    assert held.token == token  # the lock backend's own view agrees
    await world.locks.release(kept)
    after = await world.check(hold_bound_s=SHORT_BOUND_S)
    assert after.ok and after.checked["held_payout_locks"] == 0, after.as_dict()


async def test_inv10_a_grant_whose_session_expired_is_not_a_holding(world: World) -> None:
    """Boundary: a session that stopped heartbeating frees its grants (FR-03); its stale row in
    the holders table is not a lock held by a live session."""
    a = await world.account()
    short = await world.locks.open_session(ttl_s=1.0)
    g = await world.locks.acquire(short.session_id, lock_key(a), wait_s=0)
    payout_id = await world.new_payout(a, 100)
    await world.store.claim(payout_id, g.token, world.ctx)  # type: ignore[union-attr]
    deadline = time.monotonic() + 60
    while (await world.locks.inspect(lock_key(a))).holder_session is not None:
        assert time.monotonic() < deadline, "the 1 s session never expired"
        await asyncio.sleep(0.2)
    report = await world.check(hold_bound_s=0.0)
    assert report.counts()["INV-10"] == 0 and report.checked["held_payout_locks"] == 0


@pytest.fixture
async def etcd_lock_server(etcd_endpoints: list[str], key_prefix: str) -> AsyncIterator[str]:
    """A real lock server over the real etcd backend (in this event loop, no credentials)."""
    backend = await create_backend("etcd", etcd_endpoints=etcd_endpoints, prefix=key_prefix)
    try:
        async with serve_app(create_app(backend)) as url:
            yield url
    finally:
        await backend.close()


async def test_inv10_through_a_lock_server_over_etcd_and_the_sdk(
    world: World, etcd_lock_server: str
) -> None:
    """The same construction with the worker's own SDK against a real lock server over etcd:
    its session lives on by its heartbeat after the payout was claimed and declined under the
    grant; the lock server's holdings (GET /v1/locks) show the account blocked, until the
    SDK's release."""
    url = etcd_lock_server
    grants = lock_server_grant_source(url)
    holds = lock_server_hold_source(url)
    a = await world.account()
    async with LockClient(url, ttl_s=10, heartbeat_s=1) as locks:
        lease = await locks.acquire(lock_key(a), wait_s=5)
        payout_id = await world.new_payout(a, 100)
        await world.store.claim(payout_id, lease.token, world.ctx)
        await world.store.mark_submitted(payout_id, lease.token, world.ctx)
        await world.store.mark_declined(payout_id, lease.token, world.ctx, reason="declined")
        report = await _check_until_blocked(world, grants=grants, holds=holds)
        assert violated(report) == {"INV-10"}, report.as_dict()
        [only] = sample_of(report, "INV-10")
        assert only.startswith(f"account {a} blocked: {lock_key(a)} held under token={lease.token}")
        await locks.release(lease)
        after = await world.check(grants=grants, holds=holds, hold_bound_s=SHORT_BOUND_S)
        assert after.ok, after.as_dict()
