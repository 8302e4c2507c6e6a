"""Bounded blocking inside a transaction (issue 24 item 7, first bullet), on real PostgreSQL
with a real frozen process.

A holder frozen (SIGSTOP) between the UPDATEs of its posting transaction and its COMMIT keeps
the payout's, the account's and the shared rail_clearing balance rows locked. The worker's pool
sets `idle_in_transaction_session_timeout` to its lease (common.pgutil.create_pool): PostgreSQL
ends the frozen session, rolls its transaction back, and the next holder, under a newer token,
posts. The frozen holder's post never lands and nothing posts twice. Negative control: the same
freeze with the setting switched off on that connection keeps the rows locked past twice the
bound (the next holder's `lock_timeout` fires instead).

How the freeze lands between the UPDATEs and the COMMIT by construction: the test holds the
rail_clearing balance row (SELECT ... FOR UPDATE), so the holder's post blocks in its posting
statement's update of that row, after it has stamped the account's row and moved the payout's;
the test SIGSTOPs the holder there, then lets its statement finish: its session is now idle
inside the transaction, holding every row, and its client cannot send the COMMIT.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from common.db_roles import PAYDB
from common.migrate import migrate
from common.pgutil import create_database, create_pool, drop_database
from ledger import Payout, PayoutStore, WorkContext
from ledger.journal import RAIL_CLEARING
from tests.conftest import as_role

ROOT = Path(__file__).resolve().parents[2]
#: The holder's lease, as a chaos or experiment worker has it (WORKER_LOCK_TTL_S): the bound.
LEASE_S = 3.0
AMOUNT, FUNDS = 1_200, 10_000
#: What asyncpg raises in a process whose session the server ended while it was frozen. Which
#: one depends on when the thawed client reads the server's FATAL: before its next statement
#: (the COMMIT, since the posting is one statement) it is still consuming that error when the
#: COMMIT is tried, and refuses to send it (InternalClientError, "another operation is in
#: progress"); after, the statement or COMMIT finds the session gone.
CONNECTION_GONE = (
    "IdleInTransactionSessionTimeoutError",
    "ConnectionDoesNotExistError",
    "InterfaceError",
    "InternalClientError",
)


@pytest.fixture
async def paydb(pg_server_url: str) -> AsyncIterator[str]:
    url = await create_database(pg_server_url, prefix="frozen_t")
    await migrate(url)
    try:
        yield url
    finally:
        await drop_database(pg_server_url, url)


async def _acked_payout(store: PayoutStore, token: int) -> tuple[str, str]:
    ctx = WorkContext(correlation_id="frozen-test", actor="first-holder")
    account_id, payout_id = f"acct-{uuid.uuid4().hex[:8]}", f"po-{uuid.uuid4().hex[:8]}"
    await store.create_account(account_id, ctx)
    await store.fund_account(account_id, FUNDS, ctx)
    await store.create_payout(payout_id, account_id, AMOUNT, ctx)
    await store.claim(payout_id, token, ctx)
    await store.mark_submitted_and_acked(payout_id, token, ctx)
    return account_id, payout_id


async def _until(what: str, check: object, within_s: float = 60.0) -> None:
    """Poll an async condition; a failure detector's bound, not a timing claim."""
    deadline = time.monotonic() + within_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _freeze_mid_post(
    admin: asyncpg.Connection, url: str, payout_id: str, token: int, idle_s: float
) -> tuple[subprocess.Popen[str], int]:
    """Start the holder, freeze it between its UPDATEs and its COMMIT (module docstring);
    returns the process and its backend's pid."""
    blocker = await asyncpg.connect(url)
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute(
        "SELECT 1 FROM paydb.balances WHERE account_id = $1 FOR UPDATE", RAIL_CLEARING
    )
    blocker_pid = blocker.get_server_pid()
    holder = subprocess.Popen(  # noqa: ASYNC220 - start-up only; the test then awaits conditions
        [sys.executable, "-m", "tests.common.frozen_poster", as_role(url, PAYDB), payout_id,
         str(token), str(idle_s)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    backend: list[int] = []

    async def blocked_on_rail_clearing() -> bool:
        rows = await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
            " AND application_name = $2",
            blocker_pid,
            f"frozen-poster-{payout_id}",
        )
        backend[:] = [r["pid"] for r in rows]
        return bool(backend)

    await _until("the holder's post to block on rail_clearing", blocked_on_rail_clearing)
    holder.send_signal(signal.SIGSTOP)
    await tx.rollback()  # its UPDATE of rail_clearing completes; its client is frozen
    await blocker.close()

    async def idle_in_transaction() -> bool:
        state = await admin.fetchval(
            "SELECT state FROM pg_stat_activity WHERE pid = $1", backend[0]
        )
        return bool(state == "idle in transaction")

    await _until("the frozen holder's session to sit idle in its transaction", idle_in_transaction)
    return holder, backend[0]


def _thaw(holder: subprocess.Popen[str]) -> dict[str, str]:
    holder.send_signal(signal.SIGCONT)
    out, _ = holder.communicate(timeout=60)
    return dict(json.loads(out.strip().splitlines()[-1]))


async def test_a_frozen_holders_transaction_is_ended_and_the_next_holder_posts_once(
    paydb: str,
) -> None:
    """Frozen with its rows locked, the holder's session is ended by PostgreSQL after its lease;
    the next holder's post (token T2 > T1) goes through; the frozen holder's post, thawed, fails
    and never lands; the ledger has one posting, the balance is debited once."""
    first, second = 5, 6
    pool = await create_pool(
        as_role(paydb, PAYDB), min_size=1, max_size=2, idle_in_transaction_s=LEASE_S
    )
    admin = await asyncpg.connect(paydb)
    holder: subprocess.Popen[str] | None = None
    try:
        store = PayoutStore(pool)
        account_id, payout_id = await _acked_payout(store, first)
        holder, frozen_pid = await _freeze_mid_post(admin, paydb, payout_id, first, LEASE_S)
        ctx = WorkContext(correlation_id="frozen-test", actor="next-holder")
        started = time.monotonic()
        # Waits behind the frozen holder's row locks until PostgreSQL ends its session.
        posted = await asyncio.wait_for(store.post(payout_id, second, ctx), 60)
        freed_after_s = time.monotonic() - started
        assert isinstance(posted, Payout) and str(posted.state) == "POSTED"
        assert posted.fence == second
        gone = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", frozen_pid
        )
        assert gone == 0  # ended by the server, not by anyone's signal
        thawed = _thaw(holder)
        # Its connection is gone: the COMMIT (or the next statement) fails, nothing commits.
        assert thawed.get("error") in CONNECTION_GONE, thawed
        assert holder.returncode == 3
        groups = await admin.fetch(
            "SELECT token FROM paydb.ledger_groups WHERE payout_id = $1", payout_id
        )
        assert [g["token"] for g in groups] == [second]  # the frozen post never landed
        posts = await admin.fetch(
            "SELECT token FROM paydb.audit_log WHERE payout_id = $1 AND action = 'post'", payout_id
        )
        assert [p["token"] for p in posts] == [second]
        balance = await admin.fetchval(
            "SELECT balance FROM paydb.balances WHERE account_id = $1", account_id
        )
        assert balance == FUNDS - AMOUNT  # debited once
        print(f"rows free after {freed_after_s:.1f}s (bound: the holder's {LEASE_S}s lease)")
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        await admin.close()
        await pool.close()


async def test_negative_control_without_the_setting_the_frozen_holder_keeps_its_rows(
    paydb: str,
) -> None:
    """The same freeze on a connection that switches the timeout off: twice the bound later the
    rows are still locked (the next holder's lock_timeout fires), and only the holder's own end
    (here: killed, so its transaction rolls back) frees them."""
    first, second = 5, 6
    next_holder = {"lock_timeout": str(int(2 * LEASE_S * 1000))}
    pool = await create_pool(
        as_role(paydb, PAYDB), min_size=1, max_size=2, server_settings=next_holder
    )
    admin = await asyncpg.connect(paydb)
    holder: subprocess.Popen[str] | None = None
    try:
        store = PayoutStore(pool)
        _, payout_id = await _acked_payout(store, first)
        # idle_s 0: the holder's pool does not set it; the role's 15 s default is switched off
        # for that session too (the negative control must outlast 2 x LEASE_S, not 15 s).
        database = await admin.fetchval("SELECT quote_ident(current_database())")
        await admin.execute(
            f"ALTER ROLE {PAYDB} IN DATABASE {database} SET idle_in_transaction_session_timeout = 0"
        )
        holder, _ = await _freeze_mid_post(admin, paydb, payout_id, first, 0)
        ctx = WorkContext(correlation_id="frozen-test", actor="next-holder")
        with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
            await asyncio.wait_for(store.post(payout_id, second, ctx), 60)
        holder.kill()  # the frozen holder's own end: its transaction rolls back
        holder.wait(10)
        posted = await asyncio.wait_for(store.post(payout_id, second, ctx), 60)
        assert isinstance(posted, Payout) and str(posted.state) == "POSTED"
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        await admin.close()
        await pool.close()
