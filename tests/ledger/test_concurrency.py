"""Many concurrent connections racing on the same payouts with different tokens."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict

import asyncpg

from common.db_roles import PAYDB
from ledger import (
    TERMINAL_STATES,
    AlreadyAdvanced,
    FencedOut,
    InvalidTransition,
    PayoutState,
    PayoutStore,
    WorkContext,
)
from ledger.queries import ledger_discrepancies
from tests.conftest import as_role
from tests.ledger.conftest import funded_account, new_id

S = PayoutState
WORKERS = 20
ACCOUNTS = 5
PAYOUTS_PER_ACCOUNT = 3
AMOUNT = 100
FUNDS = 250  # room for two payouts of 100 per account: the third must fail at claim

NEXT_STEP = {
    S.PENDING: "claim",
    S.CLAIMED: "mark_submitted",
    S.RAIL_SUBMITTED: "mark_acked",
    S.RAIL_ACKED: "post",
}


async def _worker(url: str, token: int, payout_ids: list[str], seed: int) -> Counter[str]:
    """One worker process: its own connection, its own token; drives payouts by state (the
    recovery rule of docs/architecture.md#payout-state-machine) until terminal, or until fenced out."""
    outcomes: Counter[str] = Counter()
    ctx = WorkContext(correlation_id=f"worker-{token}", actor=f"worker-{token}")
    pool = await asyncpg.create_pool(as_role(url, PAYDB), min_size=1, max_size=1)
    try:
        store = PayoutStore(pool)
        order = payout_ids[:]
        random.Random(seed).shuffle(order)
        for payout_id in order:
            for _ in range(8):
                payout = await store.get_payout(payout_id)
                if payout.state in TERMINAL_STATES:
                    break
                step = NEXT_STEP[payout.state]
                try:
                    result = await getattr(store, step)(payout_id, token, ctx)
                except FencedOut:
                    outcomes["fenced_out"] += 1
                    break  # UC-01: abort immediately, never retry under this token
                except InvalidTransition:
                    outcomes["invalid_transition"] += 1
                    continue
                outcomes["already_advanced" if isinstance(result, AlreadyAdvanced) else step] += 1
    finally:
        await pool.close()
    return outcomes


async def test_twenty_connections_race_without_double_posting(
    paydb_url: str, pool: asyncpg.Pool, store: PayoutStore
) -> None:
    """20 workers with distinct tokens race over 15 payouts: each payout posts at most once,
    per-payout writes have non-decreasing tokens, and balance = Σ entries for every account."""
    ctx = WorkContext(correlation_id="setup", actor="setup")
    payout_ids: list[str] = []
    accounts = []
    for _ in range(ACCOUNTS):
        account = await funded_account(store, ctx, FUNDS)
        accounts.append(account)
        for _ in range(PAYOUTS_PER_ACCOUNT):
            payout_ids.append(
                (await store.create_payout(new_id("po"), account, AMOUNT, ctx)).payout_id
            )
    tokens = random.Random(7).sample(range(1, 10_000), WORKERS)
    results = await asyncio.gather(
        *(_worker(paydb_url, t, payout_ids, seed=i) for i, t in enumerate(tokens))
    )
    totals = sum(results, Counter())
    assert totals["fenced_out"] > 0  # the race really happened

    async with pool.acquire() as conn:
        groups = await conn.fetch(
            "SELECT payout_id, count(*) AS n FROM paydb.ledger_groups"
            " WHERE payout_id = ANY($1::text[]) GROUP BY payout_id",
            payout_ids,
        )
        assert all(g["n"] == 1 for g in groups)
        audit = await conn.fetch(
            "SELECT payout_id, token FROM paydb.audit_log"
            " WHERE payout_id = ANY($1::text[]) AND token IS NOT NULL ORDER BY audit_id",
            payout_ids,
        )
        assert await ledger_discrepancies(conn) == []
    # Writes to one payout serialise on its row lock, so audit order is commit order.
    seen: dict[str, list[int]] = defaultdict(list)
    for row in audit:
        seen[row["payout_id"]].append(row["token"])
    for payout_id, history in seen.items():
        assert history == sorted(history), f"{payout_id}: tokens went backwards {history}"

    final = [await store.get_payout(p) for p in payout_ids]
    assert all(p.state in TERMINAL_STATES for p in final)  # the highest token finishes them all
    for account in accounts:
        mine = [p for p in final if p.account_id == account]
        posted = [p for p in mine if p.state is S.POSTED]
        assert len(posted) == 2, [(p.state, p.failure_reason) for p in mine]
        assert [p.failure_reason for p in mine if p.state is S.FAILED] == ["insufficient_funds"]
        assert await store.balance(account) == FUNDS - 2 * AMOUNT
    assert len(groups) == ACCOUNTS * 2
