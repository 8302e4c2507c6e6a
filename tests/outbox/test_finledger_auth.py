"""Credentials at the finance ledger (docs/architecture.md, Trust): the real ledger stand-in under uvicorn,
real publishers on a real PostgreSQL outbox.

Writes only from the outbox publisher's own credential: without it a write is refused (401)
and nothing is recorded, and the publisher treats the refusal as retryable (a configuration
fault, never a dead letter on the first try). /admin/* needs an operator. Negative control: the
ledger without a credentials file records the anonymous write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from finledger import FinledgerSettings
from finledger import create_app as create_finledger
from ledger import PayoutStore, WorkContext
from outbox.delivery import Outcome, classify_status
from outbox.publisher import Publisher
from tests.outbox.conftest import new_account, outbox_rows, outbox_settings, post_payout
from tests.servers import ServerThread

IDENTITIES: dict[str, Kind] = {
    "local-operator": "operator",
    "outbox": "component",
    "worker": "component",
}
RECORD = {
    "event_id": "e-1",
    "event_type": "ledger.posted",
    "account_id": "acct-1",
    "occurred_at": "2026-01-01T00:00:00Z",
    "contract_version": "1",
    "payload": {},
}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("finledger-creds")
    files = issue_tokens(base / "tokens", IDENTITIES)
    write_credentials(base / "finledger.json", IDENTITIES, files)
    return files


@pytest.fixture(scope="module")
def ledger_url(tokens: dict[str, Path]) -> Iterator[str]:
    creds = tokens["outbox"].parent.parent / "finledger.json"
    server = ServerThread(create_finledger(FinledgerSettings(credentials_path=str(creds))))
    server.start()
    yield server.url
    server.stop()


def _h(tokens: dict[str, Path], who: str | None) -> dict[str, str]:
    if who is None:
        return {}
    return {"Authorization": f"Bearer {read_token(token_file=tokens[who])}"}


async def _call(
    url: str, method: str, path: str, headers: dict[str, str], **kw: Any
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=headers) as http:
        return await http.request(method, path, **kw)


async def _count(url: str, tokens: dict[str, Path]) -> int:
    r = await _call(url, "GET", "/v1/count", _h(tokens, "local-operator"))
    assert r.status_code == 200, r.text
    return int(r.json()["count"])


async def test_writes_and_admin_by_credential(ledger_url: str, tokens: dict[str, Path]) -> None:
    op = _h(tokens, "local-operator")
    assert (await _call(ledger_url, "POST", "/admin/reset", op)).status_code == 200
    for who, status in ((None, 401), ("worker", 403), ("local-operator", 403)):
        r = await _call(ledger_url, "PUT", "/v1/records/c-1", _h(tokens, who), json=RECORD)
        assert r.status_code == status, r.text
    assert await _count(ledger_url, tokens) == 0  # a refused write records nothing
    faults = (await _call(ledger_url, "GET", "/admin/faults", op)).json()
    for who, status in ((None, 401), ("outbox", 403), ("worker", 403)):
        h = _h(tokens, who)
        r = await _call(ledger_url, "PUT", "/admin/faults", h, json={"down": True})
        assert r.status_code == status
        assert (await _call(ledger_url, "POST", "/admin/reset", h)).status_code == status
    assert (await _call(ledger_url, "GET", "/admin/faults", op)).json() == faults
    r = await _call(ledger_url, "PUT", "/v1/records/c-1", _h(tokens, "outbox"), json=RECORD)
    assert r.status_code == 201
    assert await _count(ledger_url, tokens) == 1
    assert (await _call(ledger_url, "GET", "/health", {})).status_code == 200


async def test_a_publisher_without_its_credential_delivers_nothing(
    ledger_url: str,
    tokens: dict[str, Path],
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
) -> None:
    await _call(ledger_url, "POST", "/admin/reset", _h(tokens, "local-operator"))
    await post_payout(store, ctx, await new_account(store, ctx))
    bare = Publisher(pool, outbox_settings(ledger_url, max_attempts=50))
    try:
        done = await bare.process_once()
    finally:
        await bare.aclose()
    assert done and {outcome for _, outcome in done} == {Outcome.RETRYABLE_FAILURE}
    assert await _count(ledger_url, tokens) == 0
    assert await outbox_rows(pool, "status = 'delivery_failed'") == []  # retryable, kept
    assert classify_status(401) is Outcome.RETRYABLE_FAILURE
    good = Publisher(pool, outbox_settings(ledger_url, token_file=str(tokens["outbox"])))
    deadline = time.monotonic() + 20
    try:  # poll for the recorded fact (the refused rows wait out their short backoff first)
        while await outbox_rows(pool, "status <> 'delivered'"):
            assert time.monotonic() < deadline, "not delivered in time"
            await good.drain()
            await asyncio.sleep(0.05)
    finally:
        await good.aclose()
    assert await _count(ledger_url, tokens) >= 1


async def test_negative_control_without_credentials_the_anonymous_write_is_recorded() -> None:
    server = ServerThread(create_finledger(FinledgerSettings()))
    server.start()
    try:
        r = await _call(server.url, "PUT", "/v1/records/c-9", {}, json=RECORD)
        assert r.status_code == 201
        assert (await _call(server.url, "GET", "/v1/count", {})).json()["count"] == 1
    finally:
        server.stop()
