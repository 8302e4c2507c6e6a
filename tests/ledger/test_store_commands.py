"""Operator commands in the payment store (ledger.store.commands, issue 24): verified once when a
workflow accepts them, their assertion's nonce recorded (single use), ended once.

Real PostgreSQL, the store built as the worker builds it (the test public key, verification on).
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from ledger import Payout, PayoutState, PayoutStore, WorkContext
from ledger.errors import InvalidOperatorAssertion
from tests.grants import operator_assertion
from tests.ledger.test_store_assertions import _ambiguous


@pytest.fixture(scope="module")
def vstore(pool: asyncpg.Pool) -> PayoutStore:
    from tests.grants import grant_verifier

    return PayoutStore(pool, verifier=grant_verifier())


def _cid() -> str:
    return f"run-{uuid.uuid4().hex[:8]}:1"


async def _audit(pool: asyncpg.Pool, payout_id: str, action: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return list(
            await conn.fetch(
                "SELECT actor, details::text AS details FROM paydb.audit_log"
                " WHERE payout_id = $1 AND action = $2",
                payout_id,
                action,
            )
        )


async def _account(pool: asyncpg.Pool, payout_id: str) -> str:
    async with pool.acquire() as conn:
        return str(
            await conn.fetchval(
                "SELECT account_id FROM paydb.payouts WHERE payout_id = $1", payout_id
            )
        )


async def test_an_assertion_authorises_one_command_once(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """Accepted once (idempotent for its own command id, as a retried activity presents it);
    the same assertion under another command id is refused as `replayed`, with one audit row
    naming the command that used it, under the typed name marked unverified."""
    payout_id, _ = await _ambiguous(vstore, ctx)
    a = operator_assertion("abandon", payout_id, nonce=uuid.uuid4().hex)
    first, again = _cid(), _cid()
    kw = {"payout_id": payout_id, "action": "abandon", "reason": "r", "via": "signal"}
    ok = await vstore.accept_command(command_id=first, claimed_operator="x", assertion=a, **kw)
    assert ok.accepted and ok.outcome is None and ok.actor == "local-operator"
    retried = await vstore.accept_command(command_id=first, claimed_operator="x", assertion=a, **kw)
    assert retried == ok
    replay = await vstore.accept_command(
        command_id=again, claimed_operator="mallory", assertion=a, **kw
    )
    assert not replay.accepted and replay.outcome == "refused" and replay.code == "replayed"
    assert first in replay.why
    (row,) = await _audit(pool, payout_id, "signal_rejected:abandon")
    assert row["actor"] == "unverified:mallory" and "replayed" in row["details"]


async def test_a_revoke_must_name_the_lock_key_of_the_payouts_own_account(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """An assertion for this payout but another account's lock is refused (`wrong_key`; one
    naming no key is `unbound`, tests/lockservice/test_assertions_unit.py); the one for its own
    account's key is accepted."""
    payout_id, _ = await _ambiguous(vstore, ctx)
    own = f"payout:{await _account(pool, payout_id)}"
    kw = {"payout_id": payout_id, "action": "revoke", "reason": "r", "via": "update"}
    for key, code in (("payout:someone-else", "wrong_key"),):
        a = operator_assertion("revoke", payout_id, key=key, nonce=uuid.uuid4().hex)
        v = await vstore.accept_command(command_id=_cid(), claimed_operator="x", assertion=a, **kw)
        assert v.code == code and v.outcome == "refused"
    a = operator_assertion("revoke", payout_id, key=own, nonce=uuid.uuid4().hex)
    v = await vstore.accept_command(command_id=_cid(), claimed_operator="x", assertion=a, **kw)
    assert v.accepted and v.outcome is None


async def test_an_accepted_abandon_is_carried_out_under_its_acceptance_once(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """Carried out against the recorded acceptance: the assertion presented then is not
    re-judged (here an expired one is passed along and does not matter), the audit names the
    identity accepted, the command ends `carried_out` in the same transaction; a second use of
    the command, or a command never accepted, is refused and changes nothing."""
    payout_id, g = await _ambiguous(vstore, ctx)
    a = operator_assertion("abandon", payout_id, reason="rail ticket 8", nonce=uuid.uuid4().hex)
    cid = _cid()
    await vstore.accept_command(
        command_id=cid,
        payout_id=payout_id,
        action="abandon",
        claimed_operator="x",
        reason="free text",
        assertion=a,
        via="update",
    )
    expired = operator_assertion("abandon", payout_id, expires_in_s=-1)
    done = await vstore.abandon(payout_id, 10, ctx, grant=g, command_id=cid, assertion=expired)
    assert isinstance(done, Payout) and done.state == PayoutState.ABANDONED
    (row,) = await _audit(pool, payout_id, "abandon")
    assert row["actor"] == "local-operator" and "rail ticket 8" in row["details"]
    assert (await vstore.command(cid)).outcome == "carried_out"  # type: ignore[union-attr]
    with pytest.raises(InvalidOperatorAssertion) as ended:
        await vstore.abandon(payout_id, 10, ctx, grant=g, command_id=cid)
    assert ended.value.reason == "command_ended"
    other, g2 = await _ambiguous(vstore, ctx)
    with pytest.raises(InvalidOperatorAssertion) as unknown:
        await vstore.abandon(other, 10, ctx, grant=g2, command_id=_cid())
    assert unknown.value.reason == "command_not_accepted"
    assert (await vstore.get_payout(other)).state == PayoutState.RAIL_AMBIGUOUS


async def test_a_command_ends_once_with_one_audit_row(
    vstore: PayoutStore, pool: asyncpg.Pool, ctx: WorkContext
) -> None:
    """settle_command: refused once (a retried settle is answered with the recorded end and
    writes nothing more); the database itself refuses to change an ended command."""
    payout_id, _ = await _ambiguous(vstore, ctx)
    a = operator_assertion("abandon", payout_id, nonce=uuid.uuid4().hex)
    cid = _cid()
    await vstore.accept_command(
        command_id=cid,
        payout_id=payout_id,
        action="abandon",
        claimed_operator="x",
        reason="r",
        assertion=a,
        via="signal",
    )
    for _ in range(2):
        v = await vstore.settle_command(
            command_id=cid, outcome="refused", why="evidence", code="evidence"
        )
        assert v.outcome == "refused"
    assert len(await _audit(pool, payout_id, "signal_rejected:abandon")) == 1
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.RaiseError, match="already refused"):
            await conn.execute(
                "UPDATE paydb.operator_commands SET outcome = 'carried_out' WHERE command_id = $1",
                cid,
            )
