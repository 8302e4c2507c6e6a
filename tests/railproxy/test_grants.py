"""The rail proxy verifies the lock service's signed grant before anything else (INV-07).

Real proxy over HTTP, real rail stub, real PostgreSQL. Every refused grant must leave the world
as it was: 403 INVALID_GRANT with NOT_SUBMITTED, no movement at the stub, no attempt recorded,
the account's high-water mark unchanged. A genuine but superseded grant is the fence's business
(STALE_TOKEN), not the verifier's. The negative control turns verification off and shows the
hole the issue describes: a made-up token moves money and raises the mark.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from lockservice.server import GrantSigner, generate_keypair
from railproxy import HandoffCertainty, Outcome
from tests.grants import account_grant, forged, grant_keys, sign
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, Proxy, submit_request

# What an attacker picks: far above anything the lock service can issue (bump-epoch tops out
# near 2**62), so a mark raised to it would fence every real payout of the account out for good.
HUGE_TOKEN = 2**62 + 7


async def _mark(proxy: Proxy, account_id: str) -> int | None:
    conn = await asyncpg.connect(proxy.settings.database_url)
    try:
        value = await conn.fetchval(
            "SELECT high_token FROM railproxy.account_fences WHERE account_id = $1", account_id
        )
    finally:
        await conn.close()
    return None if value is None else int(value)


async def _established(proxy: Proxy, token: int = 10) -> str:
    """An account whose mark the lock service's genuine grant `token` has set."""
    account = f"a-{uuid.uuid4().hex[:10]}"
    ok = await proxy.client.submit(submit_request(account_id=account, token=token))
    assert ok.outcome is Outcome.ACKED, ok
    assert await _mark(proxy, account) == token
    return account


async def _assert_refused(
    proxy: Proxy, stub: Stub, account: str, token: int, grant: dict[str, Any] | None, reason: str
) -> None:
    mark_before = await _mark(proxy, account)
    req = submit_request(account_id=account, token=token, grant=grant)
    result = await proxy.client.submit(req)
    assert (result.http_status, result.code) == (403, "INVALID_GRANT"), result
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert reason in result.message, result.message
    assert await stub.movements(req.client_reference) == []  # nothing forwarded
    assert await proxy.client.get_attempts(req.payout_id) == []  # nothing recorded
    assert await _mark(proxy, account) == mark_before  # the high-water mark untouched


async def test_forged_signature_is_refused(proxy: Proxy, stub: Stub) -> None:
    """A made-up signature under an accepted key id, with a huge token: refused, mark intact."""
    account = await _established(proxy)
    grant = forged(f"payout:{account}", HUGE_TOKEN)
    await _assert_refused(proxy, stub, account, HUGE_TOKEN, grant, "does not verify")


async def test_missing_grant_is_refused(proxy: Proxy, stub: Stub) -> None:
    """A bare token (today's request shape) is not enough."""
    account = await _established(proxy)
    await _assert_refused(proxy, stub, account, HUGE_TOKEN, None, "no signed grant")


async def test_grant_of_another_accounts_key_is_refused(proxy: Proxy, stub: Stub) -> None:
    """A genuine grant of account B's lock cannot submit for account A."""
    account = await _established(proxy)
    other = account_grant(f"other-{uuid.uuid4().hex[:6]}", 99).to_json()
    await _assert_refused(proxy, stub, account, 99, other, "is for lock key")


async def test_grant_for_another_token_is_refused(proxy: Proxy, stub: Stub) -> None:
    """A genuine grant presented with a different (higher) token in the request."""
    account = await _established(proxy)
    grant = account_grant(account, 11).to_json()
    await _assert_refused(proxy, stub, account, HUGE_TOKEN, grant, "is for token 11")


async def test_expired_grant_is_refused(proxy: Proxy, stub: Stub) -> None:
    """Genuine, for this key and token, but expired by the lock service's own expires_at."""
    account = await _established(proxy)
    grant = account_grant(account, 11, expires_in_s=-1).to_json()
    await _assert_refused(proxy, stub, account, 11, grant, "expired")


async def test_grant_signed_by_a_retired_key_is_refused(proxy: Proxy, stub: Stub) -> None:
    """Signed by a key id that is no longer in the proxy's set (retired or never known)."""
    account = await _established(proxy)
    retired = GrantSigner.ephemeral("retired-k0")
    grant = sign(f"payout:{account}", 11, signer=retired).to_json()
    await _assert_refused(proxy, stub, account, 11, grant, "not accepted here")


async def test_replayed_genuine_grant_after_a_newer_one_is_stale_not_invalid(
    proxy: Proxy, stub: Stub
) -> None:
    """The signature proves issue, not recency: an older genuine grant passes verification and
    is refused by the fence as STALE_TOKEN, the mark staying at the newer token."""
    account = await _established(proxy, token=20)
    old = submit_request(account_id=account, token=19)
    result = await proxy.client.submit(old)
    assert (result.code, result.http_status) == ("STALE_TOKEN", 409)
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert await stub.movements(old.client_reference) == []
    assert await _mark(proxy, account) == 20


async def test_expired_and_superseded_grant_is_told_stale(proxy: Proxy, stub: Stub) -> None:
    """A paused holder wakes with a genuine grant both expired and superseded: it is told
    STALE_TOKEN (fenced out first, as at the payment database), and nothing moves."""
    account = await _established(proxy, token=20)
    grant = account_grant(account, 19, expires_in_s=-1).to_json()
    req = submit_request(account_id=account, token=19, grant=grant)
    result = await proxy.client.submit(req)
    assert (result.code, result.highest_token) == ("STALE_TOKEN", 20), result
    assert await stub.movements(req.client_reference) == []
    assert await _mark(proxy, account) == 20


@pytest.mark.parametrize("kid", ["test-k1", "rotated-k2"])
async def test_two_key_ids_are_accepted_at_once(
    make_proxy: MakeProxy, stub: Stub, tmp_path: Path, kid: str
) -> None:
    """Rotation: with the old and the new public key configured, grants of both verify."""
    new = generate_keypair(tmp_path, "rotated-k2")
    old_pem = grant_keys().public_dir / "test-k1.pem"
    spec = f"test-k1={old_pem},rotated-k2={new.public_dir / 'rotated-k2.pem'}"
    proxy = await make_proxy(grant_public_keys=spec)
    signer = GrantSigner.from_pem_file(new.private_path, kid) if kid == "rotated-k2" else None
    account = f"a-{uuid.uuid4().hex[:10]}"
    grant = sign(f"payout:{account}", 3, signer=signer).to_json()
    result = await proxy.client.submit(submit_request(account_id=account, token=3, grant=grant))
    assert result.outcome is Outcome.ACKED, result


async def test_negative_control_verification_off_lets_a_forged_token_move_money(
    make_proxy: MakeProxy, stub: Stub
) -> None:
    """RAILPROXY_VERIFY_GRANTS=false (experiment mode only): the forged submission for a payout
    that does not exist moves money at the stub and raises the mark above anything the lock
    service can issue -- the hole the checks above close."""
    proxy = await make_proxy(verify_grants=False, experiment_mode=True)
    account = await _established(proxy)
    req = submit_request(
        account_id=account, token=HUGE_TOKEN, grant=forged(f"payout:{account}", HUGE_TOKEN)
    )
    result = await proxy.client.submit(req)
    assert result.outcome is Outcome.ACKED, result
    assert len(await stub.movements(req.client_reference)) == 1
    assert await _mark(proxy, account) == HUGE_TOKEN
    # ... and the account's next genuine grant is now fenced out.
    genuine = await proxy.client.submit(submit_request(account_id=account, token=11))
    assert genuine.code == "STALE_TOKEN"
