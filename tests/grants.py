"""Signed grants for tests: one generated test key pair per test process (never committed).

The lock servers the fixtures start sign with this key (`lock_server_env`), the proxies and
stores they start verify with its public key (`PUBLIC_KEYS`), and tests that talk to an
enforcement point without a lock server sign grants themselves with `sign`.
"""

from __future__ import annotations

import functools
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any

from lockservice.server import GrantSigner, KeyPairFiles, generate_keypair
from lockservice.verifiers import GrantVerifier, SignedGrant

TEST_KID = "test-k1"


@functools.cache
def grant_keys() -> KeyPairFiles:
    """The process's test key pair, generated on first use under a fresh temporary directory."""
    return generate_keypair(tempfile.mkdtemp(prefix="grant-keys-"), TEST_KID)


def public_keys() -> str:
    """The `*_GRANT_PUBLIC_KEYS` value that accepts the test key."""
    return str(grant_keys().public_dir)


@functools.cache
def grant_signer() -> GrantSigner:
    return GrantSigner.from_pem_file(grant_keys().private_path, TEST_KID)


def grant_verifier() -> GrantVerifier:
    return GrantVerifier.from_spec(public_keys())


def lock_server_env() -> dict[str, str]:
    """What a lock-server subprocess needs to sign with the test key."""
    return {
        "LOCK_SIGNING_KEY_PATH": str(grant_keys().private_path),
        "LOCK_SIGNING_KEY_ID": TEST_KID,
    }


def sign(
    key: str,
    token: int,
    *,
    session_id: str = "test-session",
    expires_in_s: float = 300.0,
    signer: GrantSigner | None = None,
) -> SignedGrant:
    """A grant of `key` and `token` signed by the test key (or `signer`)."""
    expires_at = datetime.now(UTC) + timedelta(seconds=expires_in_s)
    return (signer or grant_signer()).sign_fields(key, token, session_id, expires_at)


def account_grant(account_id: str, token: int, **kw: Any) -> SignedGrant:
    """The grant of an account's payout lock (`payout:{account_id}`)."""
    return sign(f"payout:{account_id}", token, **kw)


def forged(key: str, token: int) -> dict[str, Any]:
    """A grant with a made-up signature under the accepted key id: what an attacker can send."""
    g = sign(key, token).to_json()
    return {**g, "signature": "A" * 86}


def operator_assertion(
    action: str,
    payout_id: str,
    *,
    identity: str = "local-operator",
    reason: str = "rail ticket: no record",
    expires_in_s: float = 300.0,
    signer: GrantSigner | None = None,
    key: str | None = None,
    nonce: str = "test-nonce",
) -> dict[str, Any]:
    """An operator assertion signed by the test key (as the lock server the fixtures start
    would sign it), in its wire form; `expires_in_s` <= 0 gives an expired one. A revoke's
    names a lock key (`key`, else a placeholder): the signer refuses an unbound one."""
    from lockservice.server.signing import sign_assertion

    now = datetime.now(UTC)
    return sign_assertion(
        signer or grant_signer(),
        identity=identity,
        action=action,
        payout_id=payout_id,
        reason=reason,
        issued_at=now - timedelta(seconds=600),
        expires_at=now + timedelta(seconds=expires_in_s),
        nonce=nonce,
        key=key if key is not None else ("payout:any-account" if action == "revoke" else ""),
    ).to_json()
