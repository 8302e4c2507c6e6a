"""Fixtures for the invariant checker: per test, a fresh database (paydb, railproxy and the
PostgreSQL lock backend's lockservice schema), a real rail proxy on it, a real lock backend issuing
real grants, and the session's rail stub (tests/rail.py, its amounts deciding) with an empty
movement log. Payouts are driven the way the workflow drives them: acquire a grant, claim, record
the attempt, submit through the proxy, record the outcome, post, release."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from common.db_roles import CHECKER, LOCKSERVICE, PAYDB
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from invariants.checker import (
    GrantSource,
    HoldSource,
    InvariantReport,
    WorkflowSource,
    check_invariants,
    postgres_grant_source,
    postgres_hold_source,
    stub_movement_source,
)
from invariants.evidence import HOLD_BOUND_S
from ledger import Payout, PayoutStore, WorkContext
from lockservice.api import Grant, LockBackend
from lockservice.server import create_backend
from railproxy import RailProxyClient
from tests.conftest import as_role
from tests.rail import AMBIGUOUS_SUFFIX, DECLINE_SUFFIX, Stub, signed_submit, start_proxy
from tests.servers import ServerThread

DECLINE = int(f"10{DECLINE_SUFFIX}")  # the rail declines (tests/rail.py, AMOUNT_RULES)
AMBIGUOUS = int(f"10{AMBIGUOUS_SUFFIX}")  # the rail records the movement, then answers 500


def lock_key(account_id: str) -> str:
    return f"payout:{account_id}"


@dataclass
class World:
    """One isolated world: its own database, lock backend, proxy, and the (reset) stub."""

    url: str
    pool: asyncpg.Pool
    store: PayoutStore
    locks: LockBackend
    session_id: str
    proxy_server: ServerThread
    proxy: RailProxyClient
    stub: Stub
    ctx: WorkContext = field(
        default_factory=lambda: WorkContext(correlation_id="inv-test", actor="inv-test-worker")
    )
    extra_servers: list[ServerThread] = field(default_factory=list)

    def grants(self) -> GrantSource:
        return postgres_grant_source(as_role(self.url, CHECKER))

    async def check(
        self,
        grants: GrantSource | None = None,
        *,
        workflows: WorkflowSource | None = None,
        settled: bool = False,
        holds: HoldSource | None = None,
        hold_bound_s: float = HOLD_BOUND_S,
    ) -> InvariantReport:
        """Every check also reads the locks held now (INV-10's blocked accounts) from the lock
        backend's tables, unless `holds` names another source."""
        conn = await asyncpg.connect(as_role(self.url, CHECKER))  # the checker's own role
        try:
            return await check_invariants(
                conn,
                stub_movement_source(self.stub.url),
                grants or self.grants(),
                workflow_source=workflows,
                settled=settled,
                hold_source=holds or postgres_hold_source(as_role(self.url, CHECKER)),
                hold_bound_s=hold_bound_s,
            )
        finally:
            await conn.close()

    async def account(self, funds: int = 1_000_000) -> str:
        account_id = f"acct-{uuid.uuid4().hex[:10]}"
        await self.store.create_account(account_id, self.ctx)
        if funds:
            await self.store.fund_account(account_id, funds, self.ctx)
        return account_id

    async def grant(self, account_id: str) -> Grant:
        got = await self.locks.acquire(self.session_id, lock_key(account_id), wait_s=5)
        assert isinstance(got, Grant), got
        return got

    async def new_payout(self, account_id: str, amount: int) -> str:
        payout_id = f"po-{uuid.uuid4().hex[:12]}"
        await self.store.create_payout(payout_id, account_id, amount, self.ctx)
        return payout_id

    async def submit(
        self,
        payout_id: str,
        account_id: str,
        amount: int,
        token: int,
        proxy: RailProxyClient | None = None,
    ) -> str:
        """A real proxy submission; returns the recorded outcome."""
        return await signed_submit(proxy or self.proxy, payout_id, account_id, amount, token)

    async def pay(self, account_id: str, amount: int) -> str:
        """UC-01 under one real grant: claim, submit, record the outcome, post, release."""
        payout_id = await self.new_payout(account_id, amount)
        g = await self.grant(account_id)
        try:
            claimed = await self.store.claim(payout_id, g.token, self.ctx)
            if isinstance(claimed, Payout) and claimed.state == "FAILED":
                return payout_id  # insufficient funds: no rail call
            await self.store.mark_submitted(payout_id, g.token, self.ctx)
            outcome = await self.submit(payout_id, account_id, amount, g.token)
            if outcome == "ACKED":
                await self.store.mark_acked(payout_id, g.token, self.ctx)
                await self.store.post(payout_id, g.token, self.ctx)
            elif outcome == "DECLINED":
                await self.store.mark_declined(payout_id, g.token, self.ctx, reason="declined")
            else:
                await self.store.mark_ambiguous(payout_id, g.token, self.ctx)
        finally:
            await self.locks.release(g)
        return payout_id

    def start_proxy(self, **overrides: Any) -> RailProxyClient:
        """Another real proxy on the same database (e.g. an experiment switch turned off)."""
        # The negative controls turn experiment switches off: allowed only against the stub.
        base: dict[str, Any] = {"db_pool_max": 2, "experiment_mode": True}
        server = start_proxy(self.url, self.stub.url, **(base | overrides))
        self.extra_servers.append(server)
        return RailProxyClient(server.url)

    async def stub_payment(self, reference: str, account_id: str, amount: int = 500) -> None:
        """Post to the rail directly, bypassing the proxy (a negative control only)."""
        async with httpx.AsyncClient(base_url=self.stub.url, timeout=10) as c:
            r = await c.post(
                "/payments",
                json={"client_reference": reference, "account_id": account_id, "amount": amount},
            )
            r.raise_for_status()

    async def execute(self, *statements: str) -> None:
        """Raw SQL in one transaction: how a negative control breaks what the code would not."""
        async with self.pool.acquire() as conn, conn.transaction():
            for sql in statements:
                await conn.execute(sql)


@pytest.fixture
async def world(pg_server_url: str, ruled_stub_server: ServerThread) -> AsyncIterator[World]:
    url = await create_database(pg_server_url, prefix="invariants_t")
    await migrate(url)  # admin DSN: every schema, the roles and their grants
    locks = await create_backend("postgres", database_url=as_role(url, LOCKSERVICE))
    session = await locks.open_session(ttl_s=60)
    stub = Stub(ruled_stub_server.url)
    await stub.reset()
    proxy_server = start_proxy(url, ruled_stub_server.url)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)  # admin: negative controls
    paydb_pool = await asyncpg.create_pool(as_role(url, PAYDB), min_size=1, max_size=4)
    w = World(
        url=url,
        pool=pool,
        store=PayoutStore(paydb_pool),
        locks=locks,
        session_id=session.session_id,
        proxy_server=proxy_server,
        proxy=RailProxyClient(proxy_server.url),
        stub=stub,
    )
    try:
        yield w
    finally:
        await w.proxy.aclose()
        for server in [proxy_server, *w.extra_servers]:
            server.stop()
        await locks.close()
        await paydb_pool.close()
        await pool.close()
        await drop_database(pg_server_url, url)


def violated(report: InvariantReport) -> set[str]:
    """The invariants the report says are broken."""
    return {r.invariant for r in report.results if r.count}


def sample_of(report: InvariantReport, invariant: str) -> list[str]:
    return next(r.sample for r in report.results if r.invariant == invariant)
