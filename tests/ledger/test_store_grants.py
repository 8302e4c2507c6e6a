"""The payment database's writer verifies the lock service's signed grant (INV-07).

Real PostgreSQL, the store built as the worker builds it (`verifier=` with the test public key).
A refused grant raises `InvalidGrant` and writes nothing: no row counts change, the payout keeps
its state and fence, the account's balance-row fence is untouched. A genuine but superseded
grant stays `FencedOut`. The negative control is the store without a verifier: a made-up token
claims the payout and raises the account's fence beyond anything the lock service can issue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from ledger import FencedOut, InvalidGrant, Payout, PayoutState, PayoutStore, WorkContext
from lockservice.server import GrantSigner
from tests.grants import account_grant, forged, grant_verifier, sign
from tests.ledger.conftest import funded_account, new_id, rolled_back, row_counts

HUGE_TOKEN = 2**62 + 7


@pytest.fixture(scope="module")
def vstore(role_pool: asyncpg.Pool) -> PayoutStore:
    return PayoutStore(role_pool, verifier=grant_verifier())


async def _fences(pool: asyncpg.Pool, payout_id: str) -> tuple[str, int, int]:
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT p.state, p.fence, b.fence AS account_fence FROM paydb.payouts p"
            " JOIN paydb.balances b USING (account_id) WHERE p.payout_id = $1",
            payout_id,
        )
    assert row is not None
    return str(row["state"]), int(row["fence"]), int(row["account_fence"])


async def _claimed(vstore: PayoutStore, ctx: WorkContext, token: int = 10) -> tuple[str, str]:
    """A funded account and a payout CLAIMED under the genuine grant `token`."""
    account = await funded_account(vstore, ctx, 10_000)
    payout = await vstore.create_payout(new_id("po"), account, 1_000, ctx)
    claimed = await vstore.claim(payout.payout_id, token, ctx, grant=account_grant(account, token))
    assert isinstance(claimed, Payout) and claimed.state == PayoutState.CLAIMED
    return account, payout.payout_id


Write = Callable[[PayoutStore, str, int, WorkContext, Any], Awaitable[Any]]

WRITES: dict[str, Write] = {
    "claim": lambda s, p, t, c, g: s.claim(p, t, c, grant=g),
    "stamp_account_fence": lambda s, p, t, c, g: s.stamp_account_fence(p, t, grant=g),
    "mark_submitted": lambda s, p, t, c, g: s.mark_submitted(p, t, c, grant=g),
    "post": lambda s, p, t, c, g: s.post(p, t, c, grant=g),
}


def _bad_grants(account: str) -> dict[str, tuple[int, Any, str]]:
    """name -> (presented token, grant, expected reason)."""
    return {
        "forged": (HUGE_TOKEN, forged(f"payout:{account}", HUGE_TOKEN), "bad_signature"),
        "missing": (HUGE_TOKEN, None, "missing"),
        "other_key": (99, account_grant("someone-else", 99), "key_mismatch"),
        "expired": (11, account_grant(account, 11, expires_in_s=-1), "expired"),
        "retired_key": (
            11,
            sign(f"payout:{account}", 11, signer=GrantSigner.ephemeral("retired-k0")),
            "unknown_key_id",
        ),
    }


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("case", ["forged", "missing", "other_key", "expired", "retired_key"])
async def test_refused_grant_writes_nothing(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext, write: str, case: str
) -> None:
    """Each fenced write refuses each bad grant with InvalidGrant before changing anything."""
    account, payout_id = await _claimed(vstore, ctx)
    if write == "claim":  # claim needs a PENDING payout: a fresh one of the same account
        payout_id = (await vstore.create_payout(new_id("po"), account, 500, ctx)).payout_id
    token, grant, reason = _bad_grants(account)[case]
    before = (await row_counts(pool), await _fences(pool, payout_id))
    with pytest.raises(InvalidGrant) as refused:
        await WRITES[write](vstore, payout_id, token, ctx, grant)
    assert refused.value.reason == reason
    assert (await row_counts(pool), await _fences(pool, payout_id)) == before


@pytest.mark.parametrize("case", ["other_key", "expired"])
async def test_refused_grant_never_waits_for_the_accounts_balance_row(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext, case: str
) -> None:
    """A genuine grant of another account's key, or an expired one, is refused without taking
    the payout's balance-row lock: the fenced transaction's first statement stamps only the
    account the grant names, and only while it is unexpired. Shown with the row locked by
    another transaction all along: the refusal still comes (a write that locked the row first
    would wait for that transaction, which ends only after the refusal)."""
    account, payout_id = await _claimed(vstore, ctx)
    token, grant, reason = _bad_grants(account)[case]
    async with rolled_back(pool) as holder:
        await holder.execute(
            "SELECT 1 FROM paydb.balances WHERE account_id = $1 FOR UPDATE", account
        )
        with pytest.raises(InvalidGrant) as refused:
            await asyncio.wait_for(vstore.mark_submitted(payout_id, token, ctx, grant=grant), 60)
    assert refused.value.reason == reason


async def test_replayed_genuine_grant_after_a_newer_one_is_fenced_out(
    vstore: PayoutStore, ctx: WorkContext
) -> None:
    """The signature proves issue, not recency: the older genuine grant is FencedOut."""
    account, payout_id = await _claimed(vstore, ctx, token=10)
    await vstore.stamp_account_fence(payout_id, 12, grant=account_grant(account, 12))
    with pytest.raises(FencedOut):
        await vstore.mark_submitted(payout_id, 10, ctx, grant=account_grant(account, 10))


async def test_expired_and_superseded_grant_is_fenced_out_not_invalid(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """A paused holder's grant, expired and superseded, is told FencedOut; nothing written."""
    account, payout_id = await _claimed(vstore, ctx, token=10)
    await vstore.stamp_account_fence(payout_id, 12, grant=account_grant(account, 12))
    before = await _fences(pool, payout_id)
    with pytest.raises(FencedOut):
        await vstore.mark_submitted(
            payout_id, 10, ctx, grant=account_grant(account, 10, expires_in_s=-1)
        )
    assert await _fences(pool, payout_id) == before


async def test_the_genuine_grant_takes_every_step(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """The happy path under one signed grant: claim, submit, ack, post."""
    account, payout_id = await _claimed(vstore, ctx, token=10)
    g = account_grant(account, 10)
    await vstore.mark_submitted(payout_id, 10, ctx, grant=g)
    await vstore.mark_acked(payout_id, 10, ctx, grant=g)
    posted = await vstore.post(payout_id, 10, ctx, grant=g.to_json())  # the wire form too
    assert isinstance(posted, Payout) and posted.state == PayoutState.POSTED


async def test_negative_control_without_a_verifier_a_forged_token_takes_the_account(
    store: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """Without verification (the store as a trusted caller builds it) a made-up token claims
    the payout and raises the account's fence beyond anything the lock service can issue."""
    account = await funded_account(store, ctx, 10_000)
    payout = await store.create_payout(new_id("po"), account, 1_000, ctx)
    bad = forged(f"payout:{account}", HUGE_TOKEN)
    claimed = await store.claim(payout.payout_id, HUGE_TOKEN, ctx, grant=bad)
    assert isinstance(claimed, Payout) and claimed.state == PayoutState.CLAIMED
    assert await _fences(pool, payout.payout_id) == ("CLAIMED", HUGE_TOKEN, HUGE_TOKEN)
