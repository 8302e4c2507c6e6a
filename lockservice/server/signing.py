"""Signing with the lock server's private key: grants (INV-07) and operator assertions, and the
key files the local stack, the deployment generator and the tests create.

Owns: the one object that holds the private key (`GrantSigner`), the signing of operator
assertions with it (same key, their own purpose tag), and the writing of a new key pair.
Must never: be imported outside the lock server and the tools that create its key (the SDK and
the offline verifiers never import it: pyproject.toml, "Lock service parts"), let the private key
leave the lock server, or sign bytes that are not domain-separated from every other kind of
statement (grant bytes start with `{`; an assertion's with its purpose tag). What is signed is
defined beside its verification, in lockservice.verifiers.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from lockservice.api import Grant
from lockservice.verifiers import ACTIONS, OperatorAssertion, SignedGrant
from lockservice.verifiers.assertions import check_payout_id, signed_bytes
from lockservice.verifiers.grants import b64url, canonical_bytes, check_kid


class GrantSigner:
    """Signs grants with one private key (the lock server's current key id)."""

    def __init__(self, private_key: Ed25519PrivateKey, kid: str) -> None:
        self._key = private_key
        self.kid = check_kid(kid)

    @classmethod
    def from_pem_file(cls, path: str | Path, kid: str) -> GrantSigner:
        """The signer of the key in `path`; `ValueError` (one line naming the file) when it
        cannot be read or is not an unencrypted Ed25519 private key in PEM."""
        try:
            pem = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the signing key ({exc.strerror})") from exc
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            # TypeError: an encrypted key (no password here); ValueError: not a PEM key at all.
            why = str(exc).split(". See ", 1)[0]  # cryptography appends a FAQ link
            raise ValueError(f"{path}: not a PEM private key ({why})") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 private key")
        return cls(key, kid)

    @classmethod
    def ephemeral(cls, kid: str = "ephemeral") -> GrantSigner:
        """A fresh key held only in memory: grants are signed, but nobody can verify them
        unless handed `public_key()` (in-process tests)."""
        return cls(Ed25519PrivateKey.generate(), kid)

    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def sign_message(self, message: bytes) -> str:
        """The base64url signature of `message`. Only for a statement whose bytes are
        domain-separated from every other kind (grant bytes start with `{`; an operator
        assertion's with its purpose tag, lockservice.verifiers.assertions), so one is never the
        other."""
        return b64url(self._key.sign(message))

    def sign(self, grant: Grant) -> SignedGrant:
        return self.sign_fields(grant.key, grant.token, grant.session_id, grant.expires_at)

    def sign_fields(
        self, key: str, token: int, session_id: str, expires_at: datetime
    ) -> SignedGrant:
        msg = canonical_bytes(key, token, session_id, expires_at, self.kid)
        return SignedGrant(key, token, session_id, expires_at, self.kid, self.sign_message(msg))


@dataclass(frozen=True, slots=True)
class KeyPairFiles:
    private_path: Path  # mode 0600, for the lock server only
    public_dir: Path  # `<kid>.pem` files, for the enforcement points
    kid: str


def generate_keypair(directory: str | Path, kid: str) -> KeyPairFiles:
    """Write a new Ed25519 pair: `<dir>/private/<kid>.pem` (0600) and `<dir>/public/<kid>.pem`.

    For the local stack and tests. An existing pair of that kid is kept, not overwritten.
    """
    check_kid(kid)
    root = Path(directory)
    private_dir, public_dir = root / "private", root / "public"
    private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    public_dir.mkdir(parents=True, exist_ok=True)
    private_path, public_path = private_dir / f"{kid}.pem", public_dir / f"{kid}.pem"
    if not private_path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        public_path.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return KeyPairFiles(private_path, public_dir, kid)


def sign_assertion(
    signer: GrantSigner,
    *,
    identity: str,
    action: str,
    payout_id: str,
    reason: str,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
    key: str = "",
) -> OperatorAssertion:
    """Sign with the lock server's current grant key (same key, distinct purpose tag)."""
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}")
    check_payout_id(payout_id)
    if not reason.strip():
        raise ValueError("a reason is required")
    if expires_at <= issued_at:
        raise ValueError("expires_at must be after issued_at")
    if action == "revoke" and not key:
        # Unbound, it would let an assertion asked for about payout P revoke any account's lock.
        raise ValueError("a revoke assertion must name the lock key of the payout's account")
    unsigned = OperatorAssertion(
        identity, action, payout_id, key, reason, issued_at, expires_at, nonce, signer.kid, ""
    )
    return dataclasses.replace(unsigned, signature=signer.sign_message(signed_bytes(unsigned)))


__all__ = ["GrantSigner", "KeyPairFiles", "generate_keypair", "sign_assertion"]
