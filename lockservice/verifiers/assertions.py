"""Operator assertions: the lock service's signed statement that an authenticated operator asked
for one break-glass command (`revoke` or `abandon`) of one payout, valid for a few minutes.

Owns: the assertion's wire form and canonical bytes (under a purpose tag of their own) and
verification against public keys (the lock server's force-revoke, the payment store's abandon);
the lock server signs them with its grant key (lockservice.server.signing). docs/security.md,
"Operator commands sent as Temporal signals".
Must never: load a private key, accept an assertion for another action,
payout or lock key, or one expired by the verifier's clock, or let a grant pass for an assertion
(or an assertion for a grant).

Why: a Temporal signal is not authenticated (anyone who can reach Temporal can send one), so the
operator name in it proves nothing. The CLI presents the operator's bearer token to the lock
server and gets an assertion back; the signal carries the assertion (no secret: it is a signed
statement, safe in Temporal history), and the enforcement points audit the identity inside it.

What is signed (version 1): the purpose tag `payouts.operator-assertion.v1` and a newline,
then the JSON object `{"action", "expires_at_us", "identity", "issued_at_us", "key", "kid",
"nonce", "payout_id", "purpose", "reason", "v"}` with sorted keys and no spaces, UTF-8. Grant
bytes (lockservice.verifiers.grants) are a bare JSON object and so start with `{`: no byte string
is both, so a grant's signature never verifies as an assertion's and vice versa.

Replay: an assertion is bound to its action and payout id, and a revoke's to the lock key of
the payout's account (an assertion without a key never authorises a revoke), so it can never
authorise anything else. Its nonce makes it single-use: the payment store records the nonce when a
payout workflow accepts the command (`ledger.store.commands`), and refuses it as `replayed` when
it comes again, whatever its expiry (issue 24). The TTL (5 minutes by default) bounds how long a
captured assertion is worth anything at all.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from lockservice.verifiers.grants import (
    GrantError,
    GrantVerifier,
    check_kid,
    epoch_us,
    verify_signature,
)

PURPOSE = "payouts.operator-assertion.v1"
ASSERTION_VERSION = 1
ACTIONS = ("revoke", "abandon")
#: Default and largest lifetime of an assertion (seconds).
DEFAULT_TTL_S = 300.0
MAX_TTL_S = 3600.0
_ID_RE = re.compile(r"^[A-Za-z0-9_.@:\-]{1,128}$")
_TEXT_FIELDS = ("identity", "action", "payout_id", "key", "reason", "nonce", "kid", "signature")


class AssertionRefused(Exception):
    """A presented operator assertion does not authorise this command. `code` is a stable name:
    missing, malformed, unknown_key_id, bad_signature, wrong_action, wrong_payout, wrong_key,
    unbound (a revoke assertion that names no lock key), expired."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class OperatorAssertion:
    """What the lock service states: `identity` (authenticated by its bearer token) asked for
    `action` on `payout_id` (and lock `key`, "" when unbound) for `reason`."""

    identity: str
    action: str
    payout_id: str
    key: str
    reason: str
    issued_at: datetime
    expires_at: datetime
    nonce: str
    kid: str
    signature: str

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "action": self.action,
            "payout_id": self.payout_id,
            "key": self.key,
            "reason": self.reason,
            "issued_at": self.issued_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "nonce": self.nonce,
            "kid": self.kid,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, data: Any) -> OperatorAssertion:
        """Parse a wire assertion; AssertionRefused("malformed") if anything is off."""
        if not isinstance(data, Mapping):
            raise AssertionRefused("malformed", "operator assertion is not a JSON object")
        try:
            texts = [data[f] for f in _TEXT_FIELDS]
            if not all(isinstance(t, str) for t in texts):
                raise TypeError("a text field is not a string")
            issued_at = datetime.fromisoformat(str(data["issued_at"]))
            expires_at = datetime.fromisoformat(str(data["expires_at"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise AssertionRefused("malformed", f"malformed operator assertion: {exc}") from None
        if issued_at.tzinfo is None or expires_at.tzinfo is None:
            raise AssertionRefused("malformed", "operator assertion times carry no time zone")
        try:  # a time UTC cannot hold (year 1 at +01:00) is bad input, never a crash
            epoch_us(issued_at), epoch_us(expires_at)
        except (OverflowError, ValueError):
            raise AssertionRefused("malformed", "operator assertion time out of range") from None
        identity, action, payout_id, key, reason, nonce, kid, signature = texts
        return cls(
            identity, action, payout_id, key, reason, issued_at, expires_at, nonce, kid, signature
        )


def assertion_bytes(
    *,
    identity: str,
    action: str,
    payout_id: str,
    key: str,
    reason: str,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
    kid: str,
) -> bytes:
    """The exact bytes that are signed (version 1; see the module docstring)."""
    body = {
        "v": ASSERTION_VERSION,
        "purpose": PURPOSE,
        "identity": identity,
        "action": action,
        "payout_id": payout_id,
        "key": key,
        "reason": reason,
        "issued_at_us": epoch_us(issued_at),
        "expires_at_us": epoch_us(expires_at),
        "nonce": nonce,
        "kid": kid,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{PURPOSE}\n{text}".encode()


def signed_bytes(a: OperatorAssertion) -> bytes:
    """The signed bytes of `a`: every field but the signature itself."""
    signed = {f.name: getattr(a, f.name) for f in dataclasses.fields(a) if f.name != "signature"}
    return assertion_bytes(**signed)


def check_payout_id(payout_id: str) -> str:
    if not _ID_RE.match(payout_id):
        raise ValueError("payout_id: 1-128 letters, digits or . _ @ : -")
    return payout_id


class AssertionVerifier:
    """Checks operator assertions against the lock service's public keys (several key ids at
    once, for rotation), offline."""

    def __init__(self, public_keys: Mapping[str, Ed25519PublicKey]) -> None:
        if not public_keys:
            raise ValueError("an assertion verifier needs at least one public key")
        self._keys = {check_kid(k): v for k, v in public_keys.items()}

    @classmethod
    def of(cls, grants: GrantVerifier) -> AssertionVerifier:
        """The verifier over the keys an enforcement point already holds for grants."""
        return cls(grants.public_keys)

    def verify(
        self,
        assertion: OperatorAssertion | Mapping[str, Any] | None,
        *,
        action: str,
        payout_id: str,
        key: str | None = None,
        now: datetime | None = None,
    ) -> OperatorAssertion:
        """The assertion, if the lock service signed it for `action` on `payout_id` (and `key`,
        when the assertion names one; a revoke assertion must name one) and `now` (this
        verifier's UTC clock) is before its expiry; AssertionRefused otherwise. Single use is
        the payment store's check (it records the nonce), not this one's: it keeps no state."""
        if assertion is None:
            raise AssertionRefused(
                "missing", "no operator assertion: send the command with `payouts payout`"
            )
        a = assertion if isinstance(assertion, OperatorAssertion) else None
        a = a or OperatorAssertion.from_json(assertion)
        try:
            verify_signature(
                self._keys, a.kid, a.signature, signed_bytes(a), what="operator assertion"
            )
        except GrantError as exc:
            raise AssertionRefused(exc.code, str(exc)) from None
        if a.action != action:
            raise AssertionRefused("wrong_action", f"assertion is for {a.action!r}, not {action!r}")
        if a.payout_id != payout_id:
            raise AssertionRefused(
                "wrong_payout", f"assertion is for payout {a.payout_id!r}, not {payout_id!r}"
            )
        if a.action == "revoke" and not a.key:
            raise AssertionRefused(
                "unbound", "a revoke assertion must name the lock key it may revoke; it names none"
            )
        if key is not None and a.key and a.key != key:
            raise AssertionRefused("wrong_key", f"assertion is for lock key {a.key!r}, not {key!r}")
        if (now or datetime.now(UTC)) >= a.expires_at:
            raise AssertionRefused(
                "expired", f"operator assertion expired at {a.expires_at.isoformat()}"
            )
        return a


__all__ = [
    "ACTIONS",
    "DEFAULT_TTL_S",
    "MAX_TTL_S",
    "PURPOSE",
    "AssertionRefused",
    "AssertionVerifier",
    "OperatorAssertion",
    "assertion_bytes",
    "signed_bytes",
]
