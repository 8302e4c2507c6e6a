"""Unit tests of lockservice.verifiers.assertions: the purpose tag keeps grants and operator assertions
apart (neither ever verifies as the other), and every binding (action, payout, key, expiry,
signature, key id) is checked."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from lockservice.server import GrantSigner
from lockservice.server.signing import sign_assertion
from lockservice.verifiers import (
    AssertionRefused,
    AssertionVerifier,
    BadSignature,
    GrantVerifier,
    OperatorAssertion,
    SignedGrant,
)
from lockservice.verifiers.assertions import PURPOSE, assertion_bytes

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
SIGNER = GrantSigner.ephemeral("k1")
GRANTS = GrantVerifier({"k1": SIGNER.public_key()})
ASSERTIONS = AssertionVerifier.of(GRANTS)


def _assertion(**kw: Any) -> OperatorAssertion:
    fields: dict[str, Any] = {
        "identity": "local-operator",
        "action": "revoke",
        "payout_id": "po-1",
        "reason": "stuck holder",
        "issued_at": NOW,
        "expires_at": NOW + timedelta(seconds=300),
        "nonce": "n1",
        "key": "payout:acct",
        **kw,
    }
    return sign_assertion(SIGNER, **fields)


def test_the_signed_bytes_start_with_the_purpose_tag() -> None:
    msg = assertion_bytes(
        identity="i",
        action="revoke",
        payout_id="p",
        key="",
        reason="r",
        issued_at=NOW,
        expires_at=NOW + timedelta(seconds=1),
        nonce="n",
        kid="k1",
    )
    assert msg.startswith(PURPOSE.encode() + b"\n{")
    assert b'"purpose":"payouts.operator-assertion.v1"' in msg


def test_a_valid_assertion_verifies_and_survives_the_wire() -> None:
    a = _assertion()
    got = ASSERTIONS.verify(a.to_json(), action="revoke", payout_id="po-1", now=NOW)
    assert got == a and got.identity == "local-operator"


def test_a_grant_never_verifies_as_an_assertion() -> None:
    """A genuine grant's signature, carried in an assertion's fields, is refused: the purpose
    tag makes the bytes differ."""
    grant = SIGNER.sign_fields("po-1", 7, "s", NOW + timedelta(seconds=60))
    forged = {**_assertion().to_json(), "signature": grant.signature}
    with pytest.raises(AssertionRefused) as err:
        ASSERTIONS.verify(forged, action="revoke", payout_id="po-1", now=NOW)
    assert err.value.code == "bad_signature"


def test_an_assertion_never_verifies_as_a_grant() -> None:
    a = _assertion()
    as_grant = SignedGrant("payout:acct", 7, "s", a.expires_at, a.kid, a.signature)
    with pytest.raises(BadSignature):
        GRANTS.verify(as_grant, key="payout:acct", token=7, now=NOW)


@pytest.mark.parametrize(
    ("change", "code", "later_s"),
    [
        ({"action": "abandon"}, "wrong_action", 0),
        ({"payout_id": "po-2"}, "wrong_payout", 0),
        ({"key": "payout:other"}, "wrong_key", 0),
        ({}, "expired", 300),  # by the verifier's clock, at its own expires_at
    ],
)
def test_another_binding_is_refused(change: dict[str, Any], code: str, later_s: float) -> None:
    a = _assertion(**change)
    at = NOW + timedelta(seconds=later_s)
    with pytest.raises(AssertionRefused) as err:
        ASSERTIONS.verify(a, action="revoke", payout_id="po-1", key="payout:acct", now=at)
    assert err.value.code == code


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (None, "missing"),
        ("text", "malformed"),
        ({"identity": "x"}, "malformed"),
        ({"identity": "mallory"}, "bad_signature"),  # merged over a genuine one below
        ({"kid": "k9"}, "unknown_key_id"),
        ({"signature": "!!"}, "bad_signature"),
    ],
)
def test_forged_or_malformed_assertions_are_refused(wire: Any, code: str) -> None:
    if isinstance(wire, dict) and code != "malformed":
        wire = {**_assertion().to_json(), **wire}
    with pytest.raises(AssertionRefused) as err:
        ASSERTIONS.verify(wire, action="revoke", payout_id="po-1", now=NOW)
    assert err.value.code == code


def test_bad_requests_are_not_signed() -> None:
    for kw in (
        {"action": "bump"},
        {"reason": " "},
        {"payout_id": "a b"},
        {"expires_at": NOW},
        {"key": ""},  # a revoke assertion must name the lock key it may revoke
    ):
        with pytest.raises(ValueError):
            _assertion(**kw)


def test_a_revoke_assertion_naming_no_key_is_refused_even_if_signed() -> None:
    """Signed by the lock service's key but bound to no lock (as older servers issued them):
    refused as `unbound`, whatever key the verifier is asked about, so an assertion asked for
    about one payout can never revoke another account's lock (issue 24, item 4)."""
    unbound = dataclasses.replace(_assertion(), key="", signature="")
    signed = dataclasses.replace(unbound, signature=SIGNER.sign_message(_signed_bytes(unbound)))
    for key in (None, "payout:acct", "payout:other"):
        with pytest.raises(AssertionRefused) as err:
            ASSERTIONS.verify(signed, action="revoke", payout_id="po-1", key=key, now=NOW)
        assert err.value.code == "unbound"
    # The same assertion with a key verifies: only the missing key is refused.
    ASSERTIONS.verify(_assertion(), action="revoke", payout_id="po-1", key="payout:acct", now=NOW)


def _signed_bytes(a: OperatorAssertion) -> bytes:
    fields = {f.name: getattr(a, f.name) for f in dataclasses.fields(a) if f.name != "signature"}
    return assertion_bytes(**fields)


def test_a_time_out_of_range_is_malformed_not_a_crash() -> None:
    wire = {**_assertion().to_json(), "issued_at": "0001-01-01T00:00:00+01:00"}
    with pytest.raises(AssertionRefused) as err:
        ASSERTIONS.verify(wire, action="revoke", payout_id="po-1", now=NOW)
    assert err.value.code == "malformed"
