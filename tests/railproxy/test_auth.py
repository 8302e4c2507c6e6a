"""Credentials at the rail proxy and the rail stub (docs/architecture.md, Trust): real servers (uvicorn), a
real PostgreSQL, credentials files generated as the stack generates them.

worker -> proxy and proxy -> stub authenticate per component; an unauthenticated submit is
refused before anything is recorded or forwarded (no attempt, no movement, mark unchanged); the
stub's steering endpoints need an operator; its movement log admits the reconciler's and the
checker's own credentials. Negative control: the proxy without a credentials file lets the
anonymous submit move money.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from railproxy import HandoffCertainty, Outcome, RailProxyClient
from railproxy import create_app as create_proxy
from railstub import create_app as create_stub
from tests.rail import STUB_SETTINGS
from tests.railproxy.conftest import proxy_settings, submit_request
from tests.servers import ServerThread

IDENTITIES: dict[str, Kind] = {
    "local-operator": "operator",
    "worker": "component",
    "railproxy": "component",
    "reconciler": "component",
    "invariants": "component",
}


class Creds:
    def __init__(self, base: Path) -> None:
        self.files = issue_tokens(base / "tokens", IDENTITIES)
        self.stub = write_credentials(base / "railstub.json", IDENTITIES, self.files)
        self.proxy = write_credentials(base / "railproxy.json", IDENTITIES, self.files)

    def token(self, name: str) -> str:
        token = read_token(token_file=self.files[name])
        assert token is not None
        return token

    def h(self, name: str | None) -> dict[str, str]:
        return {} if name is None else {"Authorization": f"Bearer {self.token(name)}"}


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> Creds:
    return Creds(tmp_path_factory.mktemp("rail-creds"))


@pytest.fixture(scope="module")
def stub_url(creds: Creds) -> Iterator[str]:
    settings = STUB_SETTINGS.model_copy(update={"credentials_path": creds.stub})
    server = ServerThread(create_stub(settings))
    server.start()
    yield server.url
    server.stop()


async def _stub(
    stub_url: str, method: str, path: str, who: str | None, creds: Creds, **kw: Any
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stub_url, timeout=10, headers=creds.h(who)) as http:
        return await http.request(method, path, **kw)


async def _movements(stub_url: str, creds: Creds, reference: str) -> list[dict[str, Any]]:
    r = await _stub(
        stub_url,
        "GET",
        "/admin/movements",
        "local-operator",
        creds,
        params={"client_reference": reference},
    )
    assert r.status_code == 200, r.text
    return list(r.json()["movements"])


@pytest.fixture
async def proxy(rail_db: str, stub_url: str, creds: Creds) -> AsyncIterator[str]:
    settings = proxy_settings(
        rail_db,
        stub_url,
        credentials_path=str(creds.proxy),
        token_file=str(creds.files["railproxy"]),
    )
    server = ServerThread(create_proxy(settings))
    server.start()
    yield server.url
    server.stop()


async def _mark(rail_db: str, account: str) -> int | None:
    conn = await asyncpg.connect(rail_db)
    try:
        v = await conn.fetchval(
            "SELECT high_token FROM railproxy.account_fences WHERE account_id = $1", account
        )
    finally:
        await conn.close()
    return None if v is None else int(v)


async def test_submit_needs_the_worker_credential(
    proxy: str, stub_url: str, rail_db: str, creds: Creds
) -> None:
    account = f"a-{uuid.uuid4().hex[:10]}"
    for token, status, code in (
        (None, 401, "UNAUTHENTICATED"),
        ("forged-token", 401, "UNAUTHENTICATED"),
        (creds.token("reconciler"), 403, "FORBIDDEN"),
    ):
        req = submit_request(account_id=account, token=5)
        async with RailProxyClient(proxy, token=token) as client:
            result = await client.submit(req)
        assert (result.http_status, result.code) == (status, code), result
        assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
        async with RailProxyClient(proxy, token=creds.token("worker")) as reader:
            assert await reader.get_attempts(req.payout_id) == []  # nothing recorded
        assert await _movements(stub_url, creds, req.client_reference) == []  # nothing forwarded
        assert await _mark(rail_db, account) is None  # no high-water mark raised
    req = submit_request(account_id=account, token=5)
    async with RailProxyClient(proxy, token=creds.token("worker")) as client:
        ok = await client.submit(req)
        assert ok.outcome is Outcome.ACKED, ok
    # The proxy presented its own credential to the stub, which moved the money once.
    assert len(await _movements(stub_url, creds, req.client_reference)) == 1
    async with httpx.AsyncClient(base_url=proxy) as http:
        assert (await http.get("/health")).status_code == 200  # open (network isolation)
        assert (await http.get("/metrics")).status_code == 200
        r = await http.get(f"/v1/payouts/{req.payout_id}/attempts", headers=creds.h("invariants"))
        assert r.status_code == 200 and len(r.json()["attempts"]) == 1


async def test_the_stub_refuses_a_proxy_with_a_wrong_credential(
    rail_db: str, stub_url: str, creds: Creds, tmp_path: Path
) -> None:
    """A proxy whose rail token the stub does not know: the stub records nothing."""
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-proxys-token\n")
    settings = proxy_settings(
        rail_db, stub_url, credentials_path=str(creds.proxy), token_file=str(wrong)
    )
    server = ServerThread(create_proxy(settings))
    server.start()
    try:
        req = submit_request(token=3)
        async with RailProxyClient(server.url, token=creds.token("worker")) as client:
            result = await client.submit(req)
        # A 401 is not evidence of what the rail did: the proxy keeps it UNKNOWN (ambiguous,
        # resolved by lookup), never retries it.
        assert result.outcome is Outcome.UNKNOWN, result
        assert await _movements(stub_url, creds, req.client_reference) == []
    finally:
        server.stop()


async def test_stub_endpoints_by_credential(stub_url: str, creds: Creds) -> None:
    ref = f"ref-{uuid.uuid4().hex[:10]}"
    body = {"client_reference": ref, "account_id": "acct-x", "amount": 10}
    for who, status in ((None, 401), ("worker", 403), ("local-operator", 403)):
        r = await _stub(stub_url, "POST", "/payments", who, creds, json=body)
        assert r.status_code == status, r.text
    assert await _movements(stub_url, creds, ref) == []  # a refused payment is not recorded
    before = (await _stub(stub_url, "GET", "/admin/behaviour", "local-operator", creds)).json()
    for who, status in ((None, 401), ("railproxy", 403), ("reconciler", 403)):
        r = await _stub(stub_url, "POST", "/admin/behaviour", who, creds, json={"outage": True})
        assert r.status_code == status, r.text
        assert (await _stub(stub_url, "POST", "/admin/reset", who, creds)).status_code == status
    after = (await _stub(stub_url, "GET", "/admin/behaviour", "local-operator", creds)).json()
    assert after == before  # behaviour unchanged
    r = await _stub(
        stub_url, "POST", "/admin/behaviour", "local-operator", creds, json={"decline_rate": 0.0}
    )
    assert r.status_code == 200
    for who, status in ((None, 401), ("worker", 403), ("reconciler", 200), ("invariants", 200)):
        r = await _stub(stub_url, "GET", "/admin/movements", who, creds)
        assert r.status_code == status, (who, r.text)
    assert (
        await _stub(stub_url, "POST", "/payments", "railproxy", creds, json=body)
    ).status_code in (200, 202)
    for path in ("/health", "/metrics"):
        assert (await _stub(stub_url, "GET", path, None, creds)).status_code == 200


async def test_negative_control_without_credentials_the_anonymous_submit_moves_money(
    rail_db: str, stub_url: str, creds: Creds
) -> None:
    """The proxy without a credentials file (which `python -m railproxy` refuses): the
    unauthenticated submit the protected proxy refused reaches the rail."""
    settings = proxy_settings(rail_db, stub_url, token_file=str(creds.files["railproxy"]))
    server = ServerThread(create_proxy(settings))
    server.start()
    try:
        req = submit_request(token=4)
        async with RailProxyClient(server.url) as client:
            assert (await client.submit(req)).outcome is Outcome.ACKED
        assert len(await _movements(stub_url, creds, req.client_reference)) == 1
    finally:
        server.stop()
