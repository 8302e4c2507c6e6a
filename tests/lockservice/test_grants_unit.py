"""Unit tests of lockservice.verifiers.grants: canonical bytes, signing, verification, rotation, key files."""

from __future__ import annotations

import re
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from lockservice.api import Grant
from lockservice.server import GrantSigner, generate_keypair
from lockservice.verifiers import (
    BadSignature,
    GrantExpired,
    GrantVerifier,
    KeyMismatch,
    MalformedGrant,
    MissingGrant,
    SignedGrant,
    TokenMismatch,
    UnknownKeyId,
    load_public_keys,
)
from lockservice.verifiers.grants import canonical_bytes

EXPIRES = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)
NOW = EXPIRES - timedelta(seconds=5)


def _verifier(*signers: GrantSigner) -> GrantVerifier:
    return GrantVerifier({s.kid: s.public_key() for s in signers})


def test_canonical_bytes_are_fixed_and_zone_independent() -> None:
    """The signed bytes are sorted compact JSON with the expiry in microseconds, the same for
    any spelling of the same instant (a verifier in another time zone agrees)."""
    expected = (
        b'{"expires_at_us":1796119200123456,"key":"payout:a","kid":"k1",'
        b'"session_id":"s","token":7,"v":1}'
    )
    assert canonical_bytes("payout:a", 7, "s", EXPIRES, "k1") == expected
    other_zone = EXPIRES.astimezone(timezone(timedelta(hours=-5)))
    assert canonical_bytes("payout:a", 7, "s", other_zone, "k1") == expected
    with pytest.raises(ValueError):
        canonical_bytes("payout:a", 7, "s", EXPIRES.replace(tzinfo=None), "k1")


def test_a_signed_grant_verifies_and_round_trips_through_json() -> None:
    """What the server sends (to_json) verifies at an enforcement point (from_json)."""
    signer = GrantSigner.ephemeral("k1")
    g = signer.sign(Grant("payout:a", 7, "s", EXPIRES - timedelta(seconds=15), EXPIRES))
    wire = g.to_json()
    assert _verifier(signer).verify(wire, key="payout:a", token=7, now=NOW) == g
    assert SignedGrant.from_json(wire) == g


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("token", 8),
        ("key", "payout:b"),
        ("session_id", "t"),
        ("expires_at", "2027-01-01T00:00:00+00:00"),
    ],
)
def test_any_changed_field_breaks_the_signature(field: str, value: object) -> None:
    """Every signed field is covered: changing one (and asking for it) fails as BadSignature."""
    signer = GrantSigner.ephemeral("k1")
    wire = {**signer.sign_fields("payout:a", 7, "s", EXPIRES).to_json(), field: value}
    key = str(wire["key"])
    token = int(wire["token"])
    with pytest.raises(BadSignature):
        _verifier(signer).verify(wire, key=key, token=token, now=NOW)


def test_relabelling_a_signature_with_another_key_id_fails() -> None:
    """The key id is inside the signed bytes: moving a signature to another accepted id fails."""
    a, b = GrantSigner.ephemeral("ka"), GrantSigner.ephemeral("kb")
    wire = {**a.sign_fields("payout:a", 7, "s", EXPIRES).to_json(), "kid": "kb"}
    with pytest.raises(BadSignature):
        _verifier(a, b).verify(wire, key="payout:a", token=7, now=NOW)


def test_each_refusal_has_its_own_error() -> None:
    """Missing, malformed, unknown key id, wrong key, wrong token and expired are told apart."""
    signer = GrantSigner.ephemeral("k1")
    v = _verifier(signer)
    g = signer.sign_fields("payout:a", 7, "s", EXPIRES)
    with pytest.raises(MissingGrant):
        v.verify(None, key="payout:a", token=7, now=NOW)
    with pytest.raises(MalformedGrant):
        v.verify({"key": "payout:a", "token": "7"}, key="payout:a", token=7, now=NOW)
    # A time that cannot be put in UTC (year 1 at +01:00) is malformed, not a crash.
    edge = {**g.to_json(), "expires_at": "0001-01-01T00:00:00+01:00"}
    with pytest.raises(MalformedGrant):
        v.verify(edge, key="payout:a", token=7, now=NOW)
    with pytest.raises(UnknownKeyId):
        _verifier(GrantSigner.ephemeral("k2")).verify(g, key="payout:a", token=7, now=NOW)
    with pytest.raises(KeyMismatch):
        v.verify(g, key="payout:b", token=7, now=NOW)
    with pytest.raises(TokenMismatch):
        v.verify(g, key="payout:a", token=8, now=NOW)
    with pytest.raises(GrantExpired):
        v.verify(g, key="payout:a", token=7, now=EXPIRES)
    assert v.verify(g, key="payout:a", token=7, now=EXPIRES - timedelta(microseconds=1)) == g


def test_rotation_two_key_ids_accepted_at_once_and_a_retired_one_refused() -> None:
    """Old and new key ids verify side by side; once the old one is dropped its grants fail."""
    old, new = GrantSigner.ephemeral("k1"), GrantSigner.ephemeral("k2")
    both = _verifier(old, new)
    g_old = old.sign_fields("payout:a", 7, "s", EXPIRES)
    g_new = new.sign_fields("payout:a", 8, "s", EXPIRES)
    assert both.verify(g_old, key="payout:a", token=7, now=NOW) == g_old
    assert both.verify(g_new, key="payout:a", token=8, now=NOW) == g_new
    assert both.key_ids == {"k1", "k2"}
    with pytest.raises(UnknownKeyId):
        _verifier(new).verify(g_old, key="payout:a", token=7, now=NOW)


def test_key_files_private_0600_and_public_dir_loads(tmp_path: Path) -> None:
    """generate_keypair writes a 0600 private key and a public `<kid>.pem`; the directory and
    the `kid=path` list load the same keys; a second call keeps the existing pair."""
    files = generate_keypair(tmp_path, "k1")
    assert stat.S_IMODE(files.private_path.stat().st_mode) == 0o600
    again = generate_keypair(tmp_path, "k1")
    assert again.private_path.read_bytes() == files.private_path.read_bytes()
    generate_keypair(tmp_path, "k2")
    signer = GrantSigner.from_pem_file(files.private_path, "k1")
    g = signer.sign_fields("payout:a", 7, "s", EXPIRES)
    from_dir = GrantVerifier.from_spec(str(files.public_dir))
    assert from_dir.key_ids == {"k1", "k2"}
    assert from_dir.verify(g, key="payout:a", token=7, now=NOW) == g
    listed = load_public_keys(f"k1={files.public_dir / 'k1.pem'}")
    assert set(listed) == {"k1"}
    with pytest.raises(ValueError):
        load_public_keys(str(tmp_path / "nothing-here"))
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"\xff not a key")
    for bad in (garbage, tmp_path / "missing.pem", tmp_path):  # a one-line error naming it
        with pytest.raises(ValueError, match=f"^{re.escape(str(bad))}: "):
            load_public_keys(f"k1={bad}")
    with pytest.raises(ValueError):
        GrantVerifier({})
