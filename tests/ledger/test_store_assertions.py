"""The payment store's abandon verifies the lock service's operator assertion (docs/security.md).

Real PostgreSQL, the store built as the worker builds it (`verifier=` with the test public key,
assertion verification on). A refused assertion raises `InvalidOperatorAssertion` and writes
nothing (row counts, state and fence unchanged); a valid one is audited with the identity and
reason inside it, whatever free-text name the signal carried. Negative control: with assertion
verification off (WORKER_VERIFY_OPERATOR_ASSERTIONS=false), the unasserted abandon goes through
under the free-text name.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from ledger import Payout, PayoutState, PayoutStore, WorkContext
from ledger.errors import InvalidOperatorAssertion
from lockservice.server import GrantSigner
from tests.grants import account_grant, grant_verifier, operator_assertion
from tests.ledger.conftest import funded_account, new_id, row_counts


@pytest.fixture(scope="module")
def vstore(pool: asyncpg.Pool) -> PayoutStore:
    return PayoutStore(pool, verifier=grant_verifier())


async def _ambiguous(store: PayoutStore, ctx: WorkContext) -> tuple[str, Any]:
    """A payout in RAIL_AMBIGUOUS under the genuine grant of token 10, and that grant."""
    account = await funded_account(store, ctx, 10_000)
    payout = await store.create_payout(new_id("po"), account, 1_000, ctx)
    g = account_grant(account, 10)
    await store.claim(payout.payout_id, 10, ctx, grant=g)
    await store.mark_submitted(payout.payout_id, 10, ctx, grant=g)
    ambiguous = await store.mark_ambiguous(payout.payout_id, 10, ctx, grant=g)
    assert isinstance(ambiguous, Payout) and ambiguous.state == PayoutState.RAIL_AMBIGUOUS
    return payout.payout_id, g


async def _abandon_audit(pool: asyncpg.Pool, payout_id: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return list(
            await conn.fetch(
                "SELECT actor, details::text AS details FROM paydb.audit_log"
                " WHERE payout_id = $1 AND to_state = 'ABANDONED'",
                payout_id,
            )
        )


def _bad(payout_id: str) -> dict[str, Any]:
    good = operator_assertion("abandon", payout_id)
    return {
        "missing": None,
        "malformed": {"identity": "mallory"},
        "bad_signature": {**good, "identity": "mallory"},
        "wrong_payout": operator_assertion("abandon", "po-someone-else"),
        "wrong_action": operator_assertion("revoke", payout_id),
        "expired": operator_assertion("abandon", payout_id, expires_in_s=-1),
        "unknown_key_id": operator_assertion(
            "abandon", payout_id, signer=GrantSigner.ephemeral("retired-k0")
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "malformed",
        "bad_signature",
        "wrong_payout",
        "wrong_action",
        "expired",
        "unknown_key_id",
    ],
)
async def test_a_refused_assertion_abandons_nothing(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext, case: str
) -> None:
    payout_id, g = await _ambiguous(vstore, ctx)
    before = await row_counts(pool)
    with pytest.raises(InvalidOperatorAssertion) as refused:
        await vstore.abandon(
            payout_id,
            10,
            ctx,
            operator="mallory",
            reason="let me in",
            grant=g,
            assertion=_bad(payout_id)[case],
        )
    assert refused.value.reason == case
    assert await row_counts(pool) == before
    assert (await vstore.get_payout(payout_id)).state == PayoutState.RAIL_AMBIGUOUS


async def test_a_valid_assertion_is_audited_with_its_identity(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    payout_id, g = await _ambiguous(vstore, ctx)
    a = operator_assertion("abandon", payout_id, reason="rail ticket 7")
    done = await vstore.abandon(
        payout_id, 10, ctx, operator="mallory", reason="free text", grant=g, assertion=a
    )
    assert isinstance(done, Payout) and done.state == PayoutState.ABANDONED
    (row,) = await _abandon_audit(pool, payout_id)
    assert row["actor"] == "local-operator"
    assert "rail ticket 7" in row["details"] and "mallory" not in row["details"]


async def test_negative_control_unverified_abandon_goes_through(
    pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """Assertion verification off: the abandon with no assertion and a free-text name that the
    verifying store refused is carried out, audited under that name."""
    store = PayoutStore(pool, verifier=grant_verifier(), verify_assertions=False)
    payout_id, g = await _ambiguous(store, ctx)
    done = await store.abandon(payout_id, 10, ctx, operator="mallory", reason="x", grant=g)
    assert isinstance(done, Payout) and done.state == PayoutState.ABANDONED
    assert [r["actor"] for r in await _abandon_audit(pool, payout_id)] == ["mallory"]
