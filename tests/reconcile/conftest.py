"""Fixtures for the reconciler: per test, a fresh database (paydb + railproxy), a real rail proxy
on it, and the session's real rail stub with an empty movement log; payouts are driven through
the real PayoutStore and real proxy submissions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from common.db_roles import PAYDB, RAILPROXY, RECONCILER
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from ledger import Payout, PayoutStore, WorkContext
from railproxy import ProxySettings, RailProxyClient, SubmitContext, SubmitRequest
from railproxy import create_app as create_proxy
from railproxy.models import GrantIn
from railstub import StubSettings
from railstub import create_app as create_stub
from reconcile.reconciler import (
    MovementSource,
    ReconcileReport,
    Window,
    reconcile,
    stub_movement_source,
)
from tests.conftest import as_role
from tests.grants import account_grant, public_keys
from tests.rail.conftest import ServerThread, Stub

DECLINE_SUFFIX = "13"  # amounts ending in 13: the rail declines
AMBIGUOUS_SUFFIX = "77"  # amounts ending in 77: the rail records the movement, then answers 500
RULES = [
    {"amount_suffix": DECLINE_SUFFIX, "action": "decline"},
    {"amount_suffix": AMBIGUOUS_SUFFIX, "action": "ambiguous"},
]


@pytest.fixture(scope="session")
def rec_stub_server() -> Iterator[ServerThread]:
    settings = StubSettings(
        seed=11, latency_mode="fixed", latency_fixed_ms=2, ambiguity_rate=0.0, rules=RULES
    )
    server = ServerThread(create_stub(settings))
    server.start()
    yield server
    server.stop()


@dataclass
class World:
    """One isolated world: its own database, proxy and (reset) stub."""

    url: str
    pool: asyncpg.Pool
    store: PayoutStore
    proxy: RailProxyClient
    stub: Stub
    movements: MovementSource
    account_id: str = ""
    token: int = 0
    ctx: WorkContext = field(
        default_factory=lambda: WorkContext(correlation_id="rec-test", actor="rec-test-worker")
    )

    async def db_now(self) -> datetime:
        async with self.pool.acquire() as conn:
            now: datetime = await conn.fetchval("SELECT now()")
        return now

    async def reconcile(self, window: Window, **kw: object) -> ReconcileReport:
        """A run as the reconciler's own read-only role (payouts_reconciler)."""
        conn = await asyncpg.connect(as_role(self.url, RECONCILER))
        try:
            return await reconcile(conn, self.movements, window, **kw)  # type: ignore[arg-type]
        finally:
            await conn.close()

    def next_token(self) -> int:
        self.token += 1
        return self.token

    async def new_payout(self, amount: int) -> str:
        payout_id = f"po-{uuid.uuid4().hex[:12]}"
        await self.store.create_payout(payout_id, self.account_id, amount, self.ctx)
        return payout_id

    async def submit(self, payout_id: str, amount: int, token: int) -> str:
        """A real proxy submission; returns the recorded outcome."""
        result = await self.proxy.submit(
            SubmitRequest(
                payout_id=payout_id,
                account_id=self.account_id,
                amount=amount,
                client_reference=payout_id,
                token=token,
                grant=GrantIn(**account_grant(self.account_id, token).to_json()),
                context=SubmitContext(
                    correlation_id=f"corr-{payout_id}",
                    causation_id=f"cause-{payout_id}",
                    deadline_at=datetime.now(UTC) + timedelta(seconds=5),
                ),
            )
        )
        return str(result.outcome)

    async def pay(self, amount: int, *, post: bool = True) -> str:
        """UC-01 as the workflow does it: claim, submit through the proxy, record the outcome."""
        payout_id = await self.new_payout(amount)
        token = self.next_token()
        claimed = await self.store.claim(payout_id, token, self.ctx)
        if isinstance(claimed, Payout) and claimed.state == "FAILED":
            return payout_id  # insufficient funds: no rail call
        await self.store.mark_submitted(payout_id, token, self.ctx)
        outcome = await self.submit(payout_id, amount, token)
        if outcome == "ACKED":
            await self.store.mark_acked(payout_id, token, self.ctx)
            if post:
                await self.store.post(payout_id, token, self.ctx)
        elif outcome == "DECLINED":
            await self.store.mark_declined(payout_id, token, self.ctx, reason="declined")
        else:
            await self.store.mark_ambiguous(payout_id, token, self.ctx)
        return payout_id

    async def stub_payment(self, reference: str, amount: int = 500) -> str:
        """Post to the rail directly, bypassing the proxy (a negative control only)."""
        async with httpx.AsyncClient(base_url=self.stub.url, timeout=10) as c:
            r = await c.post(
                "/payments",
                json={
                    "client_reference": reference,
                    "account_id": self.account_id,
                    "amount": amount,
                },
            )
            r.raise_for_status()
            return str(r.json()["movement_id"])


@pytest.fixture
async def world(pg_server_url: str, rec_stub_server: ServerThread) -> AsyncIterator[World]:
    url = await create_database(pg_server_url, prefix="reconcile_t")
    await migrate(url, schemas={"paydb", "railproxy"})  # admin DSN: roles and grants too
    stub = Stub(rec_stub_server.url)
    await stub.reset()
    settings = ProxySettings(
        database_url=as_role(url, RAILPROXY),
        rail_url=rec_stub_server.url,
        rail_timeout_s=2.0,
        db_pool_max=3,
        grant_public_keys=public_keys(),
    )
    proxy_server = ServerThread(create_proxy(settings))
    proxy_server.start()
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)  # admin: inspection only
    paydb_pool = await asyncpg.create_pool(as_role(url, PAYDB), min_size=1, max_size=4)
    proxy = RailProxyClient(proxy_server.url)
    w = World(
        url=url,
        pool=pool,
        store=PayoutStore(paydb_pool),
        proxy=proxy,
        stub=stub,
        movements=stub_movement_source(rec_stub_server.url),
    )
    w.account_id = f"acct-{uuid.uuid4().hex[:10]}"
    await w.store.create_account(w.account_id, w.ctx)
    await w.store.fund_account(w.account_id, 1_000_000, w.ctx)
    try:
        yield w
    finally:
        await proxy.aclose()
        proxy_server.stop()
        await paydb_pool.close()
        await pool.close()
        await drop_database(pg_server_url, url)


async def window_until_now(w: World, start: datetime) -> Window:
    """A window from `start` to the database's now: closed, since nothing runs after it."""
    return Window(start=start, end=await w.db_now())
