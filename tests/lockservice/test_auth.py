"""Credentials at the lock server (docs/architecture.md, Trust, FR-08, NFR-13): a real server over a real
PostgreSQL backend, with a credentials file generated as the stack generates it.

Each protected endpoint without a credential answers 401 and changes nothing (the lock is still
held, the epoch unchanged); a component credential where an operator is needed answers 403; an
operator's token works and the audit names the authenticated identity, whatever the body says.
Negative control: the same server without a credentials file lets the anonymous revoke through.
Operator assertions: issued to operators only; a worker-sent revoke (a Temporal signal) needs a
valid one for that payout, action and key, unexpired, and is audited as the identity inside;
negative control: with assertion verification off, the unasserted worker revoke goes through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from lockservice.api import LockBackend
from lockservice.sdk import LockClient
from lockservice.server import GrantSigner, create_app
from lockservice.server.signing import sign_assertion
from lockservice.verifiers import AssertionVerifier, OperatorAssertion
from lockservice.verifiers.assertions import assertion_bytes
from tests.lockservice import server_fixtures as _fx

KEY = "payout:auth-acct"
PAYOUT = "po-auth-1"
#: The server's signing key, so that tests can verify (and sign, for an expired one) assertions.
SIGNER = GrantSigner.ephemeral("auth-k1")
IDENTITIES: dict[str, Kind] = {
    "local-operator": "operator",
    "worker": "component",
    "invariants": "component",
}


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, str]:
    files = issue_tokens(tmp_path / "tokens", IDENTITIES)
    write_credentials(tmp_path / "lock-server.json", IDENTITIES, files)
    out = {}
    for name, f in files.items():
        token = read_token(token_file=f)
        assert token is not None
        out[name] = token
    return out


@pytest.fixture
async def backend(database_url: str, key_prefix: str) -> AsyncIterator[LockBackend]:
    from lockservice.server import create_backend

    b = await create_backend("postgres", database_url=database_url, prefix=key_prefix)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def server(
    backend: LockBackend, tokens: dict[str, str], tmp_path: Path
) -> AsyncIterator[str]:
    from common.credentials import Credentials

    creds = Credentials.load(tmp_path / "lock-server.json")
    async with _fx.serve_app(create_app(backend, credentials=creds, signer=SIGNER)) as url:
        yield url


def _h(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _hold(http: httpx.AsyncClient, token: str) -> dict[str, Any]:
    s = await http.post("/v1/sessions", json={"ttl_s": 30}, headers=_h(token))
    assert s.status_code == 200, s.text
    r = await http.post(
        "/v1/locks/acquire",
        json={"session_id": s.json()["session_id"], "key": KEY},
        headers=_h(token),
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _holder(http: httpx.AsyncClient, token: str) -> tuple[str | None, int | None]:
    info = (await http.get("/v1/locks", params={"key": KEY}, headers=_h(token))).json()
    return info["holder_session"], info["token"]


async def test_grant_endpoints_need_the_worker_credential(
    server: str, tokens: dict[str, str]
) -> None:
    async with httpx.AsyncClient(base_url=server) as http:
        for token in (None, "forged-token"):
            r = await http.post("/v1/sessions", json={"ttl_s": 30}, headers=_h(token))
            assert r.status_code == 401 and r.json()["code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        r = await http.post("/v1/sessions", json={"ttl_s": 30}, headers=_h(tokens["invariants"]))
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
        grant = await _hold(http, tokens["worker"])
        # A release without a credential is refused and the grant stays held.
        r = await http.post("/v1/locks/release", json=grant)
        assert r.status_code == 401
        assert await _holder(http, tokens["worker"]) == (grant["session_id"], grant["token"])
        # Open endpoints: health, liveness, metrics (network isolation).
        for path in ("/health", "/livez", "/metrics"):
            assert (await http.get(path)).status_code == 200


async def test_the_sdk_presents_its_token(server: str, tokens: dict[str, str]) -> None:
    async with LockClient(server, token=tokens["worker"]) as locks:
        lease = await locks.acquire(KEY)
        assert lease.token > 0
        await locks.release(lease)
    bare = LockClient(server)
    with pytest.raises(Exception, match="credential"):
        await bare.open()
    await bare.close()


async def test_force_revoke_needs_an_operator_and_audits_its_identity(
    server: str, tokens: dict[str, str]
) -> None:
    async with httpx.AsyncClient(base_url=server) as http:
        grant = await _hold(http, tokens["worker"])
        body = {"key": KEY, "operator": "mallory", "reason": "stuck holder"}
        for token, status in ((None, 401), ("forged", 401), (tokens["invariants"], 403)):
            r = await http.post("/v1/locks/revoke", json=body, headers=_h(token))
            assert r.status_code == status, r.text
            # Nothing changed: the same grant still holds the key.
            assert await _holder(http, tokens["worker"]) == (grant["session_id"], grant["token"])
        with capture_logs() as logs:
            r = await http.post("/v1/locks/revoke", json=body, headers=_h(tokens["local-operator"]))
        assert r.status_code == 200, r.text
        assert r.json()["operator"] == "local-operator"  # not the body's free-text "mallory"
        revoked = [e for e in logs if e["event"] == "lock.revoked"]
        assert revoked and all(e["operator"] == "local-operator" for e in revoked)
        assert await _holder(http, tokens["worker"]) == (None, None)


async def _assertion(
    http: httpx.AsyncClient, token: str | None, action: str = "revoke", payout_id: str = PAYOUT
) -> httpx.Response:
    body = {"action": action, "payout_id": payout_id, "reason": "stuck holder drill"}
    if action == "revoke":
        body["key"] = KEY  # a revoke assertion is bound to one lock key
    return await http.post("/v1/operator-assertions", json=body, headers=_h(token))


async def test_operator_assertions_are_issued_to_operators_only(
    server: str, tokens: dict[str, str]
) -> None:
    """No credential: 401; a component's: 403; an operator's: an assertion naming the
    authenticated identity, signed with the server's key, for that action and payout."""
    async with httpx.AsyncClient(base_url=server) as http:
        for token, status in ((None, 401), ("forged", 401), (tokens["worker"], 403)):
            assert (await _assertion(http, token)).status_code == status
        r = await _assertion(http, tokens["local-operator"])
        assert r.status_code == 200, r.text
        bad = await http.post(
            "/v1/operator-assertions",
            json={"action": "bump", "payout_id": PAYOUT, "reason": "x"},
            headers=_h(tokens["local-operator"]),
        )
        assert bad.status_code == 422
        blank = await http.post(
            "/v1/operator-assertions",
            json={"action": "revoke", "payout_id": PAYOUT, "reason": "   "},
            headers=_h(tokens["local-operator"]),
        )
        assert blank.status_code == 422, blank.text
        unbound = await http.post(
            "/v1/operator-assertions",
            json={"action": "revoke", "payout_id": PAYOUT, "reason": "no key"},
            headers=_h(tokens["local-operator"]),
        )
        assert unbound.status_code == 422 and "lock key" in unbound.text, unbound.text
    verifier = AssertionVerifier({SIGNER.kid: SIGNER.public_key()})
    a = verifier.verify(r.json(), action="revoke", payout_id=PAYOUT)
    assert a.identity == "local-operator" and a.reason == "stuck holder drill"


async def _refused_assertions(http: httpx.AsyncClient, operator: str) -> dict[str, Any]:
    """What an attacker (or a mistake) can put in a revoke signal, by the code it must get."""
    good = (await _assertion(http, operator)).json()
    now = datetime.now(UTC)
    expired = sign_assertion(
        SIGNER,
        identity="local-operator",
        action="revoke",
        payout_id=PAYOUT,
        reason="old",
        issued_at=now - timedelta(seconds=600),
        expires_at=now - timedelta(seconds=300),
        nonce="n",
        key=KEY,
    ).to_json()
    other_key = sign_assertion(
        SIGNER,
        identity="local-operator",
        action="revoke",
        payout_id=PAYOUT,
        reason="r",
        issued_at=now,
        expires_at=now + timedelta(seconds=60),
        nonce="n",
        key="payout:someone-else",
    ).to_json()
    return {
        "missing": None,
        "malformed": {"identity": "mallory"},
        "bad_signature": {**good, "identity": "mallory"},  # re-labelled: the signature breaks
        "wrong_payout": (await _assertion(http, operator, payout_id="po-other")).json(),
        "wrong_action": (await _assertion(http, operator, action="abandon")).json(),
        "wrong_key": other_key,
        "expired": expired,
        "unknown_key_id": {**good, "kid": "nobody"},
        "unbound": _unbound_revoke_assertion(now),
    }


def _unbound_revoke_assertion(now: datetime) -> dict[str, Any]:
    """Signed by the server's own key but naming no lock key, as servers before issue 24
    issued them: it could revoke any account's lock, so it is refused."""
    fields: dict[str, Any] = {
        "identity": "local-operator",
        "action": "revoke",
        "payout_id": PAYOUT,
        "key": "",
        "reason": "r",
        "issued_at": now,
        "expires_at": now + timedelta(seconds=60),
        "nonce": "n-unbound",
        "kid": SIGNER.kid,
    }
    signature = SIGNER.sign_message(assertion_bytes(**fields))
    return OperatorAssertion(**fields, signature=signature).to_json()


async def test_a_worker_revoke_needs_a_valid_operator_assertion(
    server: str, tokens: dict[str, str]
) -> None:
    """The revoke activity (a Temporal signal) is carried out only with the server's assertion
    for that payout and action, unexpired by the server's clock, and the identity inside it is
    audited; every other one answers 403 with its code and the holder keeps the lock."""
    async with httpx.AsyncClient(base_url=server) as http:
        grant = await _hold(http, tokens["worker"])
        base = {"key": KEY, "operator": "mallory", "reason": "signal", "payout_id": PAYOUT}
        for code, assertion in (await _refused_assertions(http, tokens["local-operator"])).items():
            body = {**base, "assertion": assertion}
            r = await http.post("/v1/locks/revoke", json=body, headers=_h(tokens["worker"]))
            assert r.status_code == 403, (code, r.text)
            assert r.json()["code"] == f"operator_assertion_{code}"
            assert await _holder(http, tokens["worker"]) == (grant["session_id"], grant["token"])
        good = (await _assertion(http, tokens["local-operator"])).json()
        with capture_logs() as logs:
            r = await http.post(
                "/v1/locks/revoke",
                json={**base, "assertion": good},
                headers=_h(tokens["worker"]),
            )
        assert r.status_code == 200, r.text
        assert r.json()["operator"] == "local-operator"  # not "mallory", not the worker
        assert r.json()["reason"] == "stuck holder drill"  # the asserted reason
        revoked = [e for e in logs if e["event"] == "lock.revoked"]
        assert revoked and revoked[0]["operator"] == "local-operator"
        assert await _holder(http, tokens["worker"]) == (None, None)


async def test_negative_control_unverified_worker_revoke_goes_through(
    backend: LockBackend, tokens: dict[str, str], tmp_path: Path
) -> None:
    """Assertion verification off (LOCK_VERIFY_OPERATOR_ASSERTIONS=false, the experiment
    switch): the worker's revoke with no assertion and a free-text name ends the grant."""
    from common.credentials import Credentials

    creds = Credentials.load(tmp_path / "lock-server.json")
    app = create_app(backend, credentials=creds, verify_operator_assertions=False)
    async with _fx.serve_app(app) as url, httpx.AsyncClient(base_url=url) as http:
        await _hold(http, tokens["worker"])
        body = {"key": KEY, "operator": "mallory", "reason": "signal"}
        r = await http.post("/v1/locks/revoke", json=body, headers=_h(tokens["worker"]))
        assert r.status_code == 200, r.text
        assert r.json()["operator"] == "worker/unverified:mallory"
        assert await _holder(http, tokens["worker"]) == (None, None)


async def test_bump_epoch_needs_an_operator(
    server: str, backend: LockBackend, tokens: dict[str, str]
) -> None:
    before = (await backend.issuance_position()).epoch
    body = {"min_epoch": before + 1, "operator": "0", "reason": "fuzz"}
    async with httpx.AsyncClient(base_url=server) as http:
        for token, status in ((None, 401), (tokens["worker"], 403), (tokens["invariants"], 403)):
            r = await http.post("/v1/epoch/bump", json=body, headers=_h(token))
            assert r.status_code == status, r.text
            assert (await backend.issuance_position()).epoch == before
        # The step bound (+16) still holds for an authenticated operator.
        too_far = dict(body, min_epoch=before + 17)
        r = await http.post("/v1/epoch/bump", json=too_far, headers=_h(tokens["local-operator"]))
        assert r.status_code == 409 and r.json()["code"] == "epoch_refused"
        assert (await backend.issuance_position()).epoch == before
        with capture_logs() as logs:
            r = await http.post("/v1/epoch/bump", json=body, headers=_h(tokens["local-operator"]))
        assert r.status_code == 200 and r.json()["epoch"] == before + 1
    bumped = [e for e in logs if e["event"] == "lock.epoch_bumped"]
    assert bumped and bumped[0]["operator"] == "local-operator"


async def test_negative_control_without_credentials_anyone_revokes(
    backend: LockBackend, tokens: dict[str, str]
) -> None:
    """Authentication off (no credentials file, which `main` refuses): the anonymous revoke
    that the protected server refused goes through and ends the holder's grant."""
    async with _fx.serve_app(create_app(backend)) as url, httpx.AsyncClient(base_url=url) as http:
        await _hold(http, tokens["worker"])
        r = await http.post("/v1/locks/revoke", json={"key": KEY, "reason": "anyone"})
        assert r.status_code == 200 and r.json()["operator"] == "unauthenticated"
        assert await _holder(http, "") == (None, None)


async def test_the_cli_presents_the_operator_token(
    server: str, tokens: dict[str, str], tmp_path: Path
) -> None:
    """`python -m lockservice revoke` reads $PAYOUTS_OPERATOR_TOKEN_FILE; without it, 401 and
    the holder keeps the lock; with it, the output and the audit name the operator."""
    import asyncio
    import os
    import subprocess
    import sys

    async with httpx.AsyncClient(base_url=server) as http:
        grant = await _hold(http, tokens["worker"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYOUTS_OPERATOR_TOKEN")}
    cmd = [sys.executable, "-m", "lockservice", "revoke", KEY, "--reason", "r", "--url", server]

    async def run(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run, cmd, capture_output=True, text=True, env={**env, **extra_env}
        )

    done = await run({})
    assert done.returncode == 1 and "401" in done.stderr
    async with httpx.AsyncClient(base_url=server) as http:
        assert await _holder(http, tokens["worker"]) == (grant["session_id"], grant["token"])
    (tmp_path / "op.token").write_text(tokens["local-operator"] + "\n")
    done = await run({"PAYOUTS_OPERATOR_TOKEN_FILE": str(tmp_path / "op.token")})
    assert done.returncode == 0, done.stderr
    assert "local-operator" in done.stdout
