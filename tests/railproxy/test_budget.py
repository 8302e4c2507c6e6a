"""The Connection's shared budget (railproxy.budget) on real PostgreSQL: a slot and a permit are
taken both or neither, a dead taker's slot frees itself and only its taker frees it early, a
slow or absent database refuses the call (fail closed, NOT_SUBMITTED, nothing sent), and lookups
take their own budget, never the submissions'.

The many-process proof (N proxies, one stub counting) is tests/railproxy/test_replicas.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from common.db_roles import RAILPROXY
from common.migrate import migrate
from common.pgutil import create_database, create_pool, drop_database
from railproxy.budget import Limits, SharedBudget
from railproxy.errors import AdmissionFull, LookupUnavailable, RateLimited, StoreUnavailable
from railproxy.models import HandoffCertainty, Outcome
from stack.embedded.shared import free_port
from tests.conftest import as_role
from tests.pgoutage import database_down
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, submit_request


@pytest.fixture
async def pool(rail_db: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(as_role(rail_db, RAILPROXY), min_size=1, max_size=3)
    yield p
    await p.close()


def _budget(
    pool: asyncpg.Pool,
    connection: str,
    *,
    slots: int = 1,
    rate: float = 100.0,
    burst: int = 100,
    call_s: float = 60.0,
) -> SharedBudget:
    return SharedBudget(
        pool,
        Limits("submit", slots, rate, burst, call_s),
        connection_id=connection,
        replica_id="replica-under-test",
        margin_s=0.2,
        statement_timeout_s=5.0,
    )


async def _rows(pool: asyncpg.Pool, connection: str, kind: str) -> list[asyncpg.Record]:
    return list(
        await pool.fetch(
            "SELECT slot, busy_until > clock_timestamp() AS busy, lease_id,"
            " CASE WHEN busy_until > '-infinity'"
            "  THEN extract(epoch FROM busy_until - taken_at)::float8 END AS held_s"
            " FROM railproxy.budget_slots WHERE connection_id = $1 AND kind = $2 ORDER BY slot",
            connection,
            kind,
        )
    )


async def test_a_slot_and_a_permit_are_taken_both_or_neither(pool: asyncpg.Pool) -> None:
    """No permit: RATE_LIMITED and the free slot stays free; no slot: ADMISSION_FULL and the
    free permit stays free. A slot is held call + margin, a permit burst / rate."""
    connection = f"b-{uuid.uuid4().hex[:8]}"
    budget = _budget(pool, connection, slots=1, rate=0.001, burst=1, call_s=3.0)
    await budget.provision()
    async with budget.lease(wait_s=0):
        (slot,) = await _rows(pool, connection, "concurrency")
        (permit,) = await _rows(pool, connection, "rate")
        assert slot["busy"] and permit["busy"]
        assert slot["held_s"] == pytest.approx(3.2)  # call_s + margin_s
        assert permit["held_s"] == pytest.approx(1000.0)  # burst / rate
    assert not (await _rows(pool, connection, "concurrency"))[0]["busy"]  # released
    with pytest.raises(RateLimited):
        await budget.acquire(wait_s=0)
    assert not (await _rows(pool, connection, "concurrency"))[0]["busy"]  # not taken alone

    other = f"b-{uuid.uuid4().hex[:8]}"
    roomy = _budget(pool, other, slots=1, rate=100.0, burst=2)
    await roomy.provision()
    held = await roomy.acquire(wait_s=0)
    with pytest.raises(AdmissionFull):
        await roomy.acquire(wait_s=0)
    assert [p["busy"] for p in await _rows(pool, other, "rate")] == [True, False]
    await roomy.release(held)


async def test_a_dead_takers_slot_frees_itself_and_only_its_taker_frees_it(
    pool: asyncpg.Pool,
) -> None:
    """A taker that never releases (a replica SIGKILLed mid-call) holds its slot until its lease
    runs out; then another takes it, and the dead one's late release does not free that."""
    connection = f"b-{uuid.uuid4().hex[:8]}"
    dead = _budget(pool, connection, call_s=0.2)  # lease 0.4 s
    alive = _budget(pool, connection, call_s=60.0)  # lease 60.2 s
    await dead.provision()
    lost = await dead.acquire(wait_s=0)
    with pytest.raises(AdmissionFull):
        await alive.acquire(wait_s=0)
    held = await alive.acquire(wait_s=30)  # polls until the dead taker's lease has run out
    await dead.release(lost)  # late: matches no row
    with pytest.raises(AdmissionFull):
        await alive.acquire(wait_s=0)
    await alive.release(held)
    await alive.release(await alive.acquire(wait_s=0))


async def test_a_database_that_does_not_answer_refuses_the_call(
    pool: asyncpg.Pool, make_proxy: MakeProxy, stub: Stub, rail_db: str
) -> None:
    """The budget table locked (a slow database): the take times out and the submission is
    STORE_UNAVAILABLE, NOT_SUBMITTED -- no attempt recorded, nothing at the rail. A database
    nobody listens on: StoreUnavailable too."""
    proxy = await make_proxy(budget_timeout_s=0.3)
    assert (await proxy.client.submit(submit_request())).outcome is Outcome.ACKED
    locker = await asyncpg.connect(rail_db)
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE railproxy.budget_slots IN ACCESS EXCLUSIVE MODE")
            req = submit_request()
            refused = await proxy.client.submit(req)
    finally:
        await locker.close()
    assert (refused.code, refused.handoff_certainty) == (
        "STORE_UNAVAILABLE",
        HandoffCertainty.NOT_SUBMITTED,
    )
    assert await proxy.client.get_attempts(req.payout_id) == []
    assert await stub.movements(req.client_reference) == []
    assert (await proxy.client.submit(submit_request())).outcome is Outcome.ACKED  # unlocked

    nowhere = await create_pool(f"postgresql://127.0.0.1:{free_port()}/x", min_size=0)
    try:
        with pytest.raises(StoreUnavailable):
            await _budget(nowhere, "b-nowhere").acquire(wait_s=0)
    finally:
        await nowhere.close()


@pytest.fixture
async def own_db(pg_server_url: str) -> AsyncIterator[str]:
    """A database of the test's own, to take down without touching the session's."""
    url = await create_database(pg_server_url, prefix="rail_budget_t")
    await migrate(url, schemas={"railproxy"})
    yield url
    await drop_database(pg_server_url, url)


async def test_lookups_take_the_lookup_budget_not_the_submissions(
    make_proxy: MakeProxy, stub: Stub, own_db: str, pg_server_url: str
) -> None:
    """A used-up lookup budget refuses the next lookup (nothing reaches the rail) while
    submissions go on; with the database down a lookup is refused too (fail closed)."""
    proxy = await make_proxy(lookup_rate_per_s=0.001, lookup_rate_burst=1, lookup_attempts=2)
    assert (await proxy.client.lookup("ref-budget-1")).status == "not_found"
    seen = await stub.lookups()
    with pytest.raises(LookupUnavailable):
        await proxy.client.lookup("ref-budget-2")
    assert await stub.lookups() == seen  # refused before the rail
    assert (await proxy.client.submit(submit_request())).outcome is Outcome.ACKED

    roomy = await make_proxy(
        connection_id=f"b-{uuid.uuid4().hex[:8]}", database_url=as_role(own_db, RAILPROXY)
    )
    assert (await roomy.client.lookup("ref-budget-3")).status == "not_found"
    seen = await stub.lookups()
    async with database_down(pg_server_url, own_db):
        with pytest.raises(LookupUnavailable):
            await roomy.client.lookup("ref-budget-4")
    assert await stub.lookups() == seen
