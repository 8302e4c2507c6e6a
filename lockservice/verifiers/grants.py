"""Signed grants: what the lock service states about a grant, in a form anyone can check offline.

Owns: the signed grant's canonical bytes, Ed25519 verification (the enforcement points), the
public key files, and key ids for rotation (INV-07; docs/architecture.md, "Signed grants"). The
signing itself is the lock server's (lockservice.server.signing, the one holder of the key).
Must never: hold or load a private key, call the lock service back, or decide whether a token is
the newest: the signature proves the lock service issued the grant;
the fence (T >= stored fence) still decides whether it is current.

Standard library and `cryptography` only, so the rail proxy and the payment store can import it.

What is signed (version 1): the JSON object `{"expires_at_us", "key", "kid", "session_id",
"token", "v"}` with sorted keys and no spaces, UTF-8. `expires_at_us` is the grant's expiry as
the lock service stated it, in integer microseconds since the Unix epoch (no time-zone spelling to
disagree on). The key id is inside the signed bytes, so a signature cannot be re-labelled with
another key's id.

Errors::

    GrantError                 code (a stable name) says which check refused the grant
     +-- MissingGrant          no grant was presented
     +-- MalformedGrant        a field is missing or of the wrong type
     +-- UnknownKeyId          signed by a key id this verifier does not accept (unknown or retired)
     +-- BadSignature          the signature does not verify under that key id
     +-- KeyMismatch           a genuine grant, but of another lock key (another account)
     +-- TokenMismatch         a genuine grant, but the request names another token
     +-- GrantExpired          expired by the lock service's own `expires_at`

Order at the enforcement points: authenticity first (`verify(..., check_expiry=False)`), then,
for an expired grant, a read-only look at the fence (a newer token on record: fenced out), then
`check_not_expired`. A stale holder is told it is fenced out before it is told it expired.

Rotation: the verifier accepts every key id it was given (several at once). To rotate, add the
new public key to every enforcement point, switch the lock server's signing key, then remove the
old public key once no grant signed by it can still be valid (one TTL later).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

GRANT_VERSION = 1
_KID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --------------------------------------------------------------------------- errors


class GrantError(Exception):
    """A presented grant is not one the lock service issued for this request."""

    code = "invalid_grant"


class MissingGrant(GrantError):
    code = "missing"


class MalformedGrant(GrantError):
    code = "malformed"


class UnknownKeyId(GrantError):
    code = "unknown_key_id"


class BadSignature(GrantError):
    code = "bad_signature"


class KeyMismatch(GrantError):
    code = "key_mismatch"


class TokenMismatch(GrantError):
    code = "token_mismatch"


class GrantExpired(GrantError):
    code = "expired"


# --------------------------------------------------------------------------- the value


@dataclass(frozen=True, slots=True)
class SignedGrant:
    """A grant as the lock service signed it. `signature` is base64url (no padding)."""

    key: str
    token: int
    session_id: str
    expires_at: datetime
    kid: str
    signature: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "token": self.token,
            "session_id": self.session_id,
            "expires_at": self.expires_at.isoformat(),
            "kid": self.kid,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SignedGrant:
        """Parse a wire grant; MalformedGrant if anything is missing or mistyped."""
        try:
            token = data["token"]
            if isinstance(token, bool) or not isinstance(token, int):
                raise TypeError("token")
            expires_at = data["expires_at"]
            if not isinstance(expires_at, datetime):
                expires_at = datetime.fromisoformat(str(expires_at))
            fields = [data[f] for f in ("key", "session_id", "kid", "signature")]
            if not all(isinstance(f, str) for f in fields):
                raise TypeError("text field")
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedGrant(f"malformed grant: {exc}") from None
        if expires_at.tzinfo is None:
            raise MalformedGrant("malformed grant: expires_at has no time zone")
        try:  # a time at the edge of the calendar cannot be put in UTC: malformed, never a 500
            expires_at.astimezone(UTC)
        except OverflowError:
            raise MalformedGrant("malformed grant: expires_at is out of range") from None
        key, session_id, kid, signature = fields
        return cls(key, token, session_id, expires_at, kid, signature)


def canonical_bytes(key: str, token: int, session_id: str, expires_at: datetime, kid: str) -> bytes:
    """The exact bytes that are signed (version 1; see the module docstring)."""
    if expires_at.tzinfo is None:
        raise ValueError("expires_at must carry a time zone")
    expires_us = epoch_us(expires_at)
    body = {
        "v": GRANT_VERSION,
        "key": key,
        "token": token,
        "session_id": session_id,
        "expires_at_us": expires_us,
        "kid": kid,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def epoch_us(at: datetime) -> int:
    """Integer microseconds since the Unix epoch (no time-zone spelling to disagree on); shared
    by every signed statement of the lock service (grants, operator assertions)."""
    if at.tzinfo is None:
        raise ValueError("a signed time must carry a time zone")
    delta = at.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise BadSignature("signature is not base64url") from None


def check_kid(kid: str) -> str:
    if not _KID_RE.match(kid):
        raise ValueError(f"key id {kid!r}: 1-64 letters, digits, '.', '_' or '-'")
    return kid


# --------------------------------------------------------------------------- verifying


class GrantVerifier:
    """Checks signed grants against public keys only, without calling the lock service.

    Every key id in `public_keys` is accepted at once (rotation); a key id not in it (unknown, or
    retired by removing its file) is refused.
    """

    def __init__(self, public_keys: Mapping[str, Ed25519PublicKey]) -> None:
        if not public_keys:
            raise ValueError("a grant verifier needs at least one public key")
        self._keys = {check_kid(k): v for k, v in public_keys.items()}

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    @property
    def public_keys(self) -> Mapping[str, Ed25519PublicKey]:
        """The accepted keys by id (an operator-assertion verifier uses the same ones)."""
        return dict(self._keys)

    def verify(
        self,
        grant: SignedGrant | Mapping[str, Any] | None,
        *,
        key: str | None,
        token: int,
        now: datetime | None = None,
        check_expiry: bool = True,
    ) -> SignedGrant:
        """The grant, if the lock service signed it for `key` and `token` and it has not expired
        by its own `expires_at` at `now` (UTC wall clock); a GrantError otherwise.

        `key=None` skips only the key comparison, for a caller that checks it itself once it
        has read which account the write touches (`check_key`). `check_expiry=False` proves
        only that the grant is genuine: an enforcement point that tells a stale holder "fenced
        out" before "expired" checks the fence next and `check_not_expired` after it.
        """
        if grant is None:
            raise MissingGrant("no signed grant presented")
        g = grant if isinstance(grant, SignedGrant) else SignedGrant.from_json(grant)
        msg = canonical_bytes(g.key, g.token, g.session_id, g.expires_at, g.kid)
        verify_signature(self._keys, g.kid, g.signature, msg, what="grant")
        if key is not None:
            check_key(g, key)
        if g.token != token:
            raise TokenMismatch(f"grant is for token {g.token}, the request presents {token}")
        if check_expiry:
            check_not_expired(g, now)
        return g

    @classmethod
    def from_spec(cls, spec: str) -> GrantVerifier:
        """Public keys from a directory of `<kid>.pem` files, or a comma list of `kid=path`."""
        return cls(load_public_keys(spec))


def verify_signature(
    keys: Mapping[str, Ed25519PublicKey], kid: str, signature: str, message: bytes, *, what: str
) -> None:
    """UnknownKeyId or BadSignature unless `signature` verifies `message` under key id `kid`
    (shared by grants and operator assertions; their bytes are domain-separated)."""
    public = keys.get(kid)
    if public is None:
        raise UnknownKeyId(f"{what} signed by key id {kid!r}, which is not accepted here")
    try:
        public.verify(_unb64(signature), message)
    except InvalidSignature:
        raise BadSignature(f"{what} signature does not verify") from None


def verifier_from_settings(verify: bool, spec: str | None, variable: str) -> GrantVerifier | None:
    """An enforcement point's verifier from its settings: None only when verification is off
    (an experiment switch); `ValueError` naming `variable` when the keys are missing or bad."""
    if not verify:
        return None
    if not spec:
        raise ValueError(
            f"{variable} is not set: every grant is verified with the lock service's public "
            "keys (INV-07); refusing to start"
        )
    try:
        return GrantVerifier.from_spec(spec)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{variable}: {exc}; refusing to start") from exc


def is_expired(grant: SignedGrant, now: datetime | None = None) -> bool:
    """Whether `now` (UTC wall clock) has reached the grant's own `expires_at`."""
    return (now or datetime.now(UTC)) >= grant.expires_at


def check_not_expired(grant: SignedGrant, now: datetime | None = None) -> None:
    """GrantExpired once `now` (UTC wall clock) reaches the grant's own `expires_at`."""
    if is_expired(grant, now):
        raise GrantExpired(f"grant expired at {grant.expires_at.isoformat()} (lock service's)")


def check_key(grant: SignedGrant, key: str) -> None:
    """KeyMismatch unless the (verified) grant is for lock key `key`."""
    if grant.key != key:
        raise KeyMismatch(f"grant is for lock key {grant.key!r}, not {key!r}")


# --------------------------------------------------------------------------- key files


def load_public_keys(spec: str) -> dict[str, Ed25519PublicKey]:
    """`spec` is a directory holding `<kid>.pem` public keys, or `kid=path[,kid=path...]`."""
    spec = spec.strip()
    if not spec:
        raise ValueError("no public keys configured")
    if "=" in spec:
        pairs = [item.split("=", 1) for item in spec.split(",") if item.strip()]
        paths = {kid.strip(): Path(path.strip()) for kid, path in pairs}
    else:
        folder = Path(spec)
        if not folder.is_dir():
            raise ValueError(f"{spec}: not a directory of <kid>.pem public keys")
        paths = {p.stem: p for p in sorted(folder.glob("*.pem"))}
    keys: dict[str, Ed25519PublicKey] = {}
    for kid, path in paths.items():
        key = _public_key(path)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{path}: not an Ed25519 public key")
        keys[check_kid(kid)] = key
    if not keys:
        raise ValueError(f"{spec}: no public keys found")
    return keys


def _public_key(path: Path) -> object:
    """The key in `path`; `ValueError` naming the file when it cannot be read or parsed."""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the public key ({exc.strerror})") from exc
    try:
        return serialization.load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm) as exc:
        why = str(exc).split(". See ", 1)[0]  # cryptography appends a FAQ link
        raise ValueError(f"{path}: not a PEM public key ({why})") from exc


__all__ = [
    "BadSignature",
    "GrantError",
    "GrantExpired",
    "GrantVerifier",
    "KeyMismatch",
    "MalformedGrant",
    "MissingGrant",
    "SignedGrant",
    "TokenMismatch",
    "UnknownKeyId",
    "b64url",
    "canonical_bytes",
    "check_key",
    "check_not_expired",
    "epoch_us",
    "is_expired",
    "load_public_keys",
    "verify_signature",
]
