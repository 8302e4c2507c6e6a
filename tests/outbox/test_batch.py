"""Batched delivery (issue 16): one claim, one HTTP request to `POST /v1/records:batch`, one
UPDATE; each item still booked at most once and classified on its own.

Real PostgreSQL and the real finance ledger: in-process under uvicorn, and as its own process
(`python -m finledger`, with credentials) for the timeout-and-redelivery case.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from ledger import PayoutStore, WorkContext
from outbox.delivery import DownstreamClient, Outcome
from outbox.publisher import Publisher
from stack.embedded.shared import free_port
from tests.outbox.conftest import (
    FinLedger,
    MakePublisher,
    new_account,
    outbox_rows,
    outbox_settings,
    post_payout,
)
from tests.workflows.system import spawn, stop, wait_healthy


def _record(account_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "event_type": "ledger.posted",
        "account_id": account_id,
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "contract_version": "paydb.v1",
        "payload": payload,
    }


async def test_batch_answers_each_item_as_the_single_write_would(finledger: FinLedger) -> None:
    """Per item: 201 created, 200 duplicate, 409 conflict, 404 unknown account; the single
    write (older publishers) still works beside it and sees the batch's bookings."""
    await finledger.set_faults(unknown_account_prefixes=["gone"])
    first = _record("acct-a", {"amount": 1})
    assert (await finledger.write("k:old", first)).status_code == 201  # the single endpoint
    items = [
        {"correlation_id": "k:old", **first},  # same content: duplicate
        {"correlation_id": "k:new", **_record("acct-a", {"amount": 2})},
        {"correlation_id": "k:gone", **_record("gone-1", {"amount": 3})},
        {"correlation_id": "k:old", **_record("acct-a", {"amount": 9})},  # other content
    ]
    r = await finledger.call("POST", "/v1/records:batch", json={"records": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [(x["correlation_id"], x["status"]) for x in results] == [
        ("k:old", 200),
        ("k:new", 201),
        ("k:gone", 404),
        ("k:old", 409),
    ]
    assert sorted(x["correlation_id"] for x in await finledger.records()) == ["k:new", "k:old"]
    # the single write answers duplicate for what the batch booked
    again = await finledger.write(
        "k:new", {k: v for k, v in items[1].items() if k != "correlation_id"}
    )
    assert again.status_code == 200
    # malformed batches are refused whole, nothing booked
    bad = await finledger.call("POST", "/v1/records:batch", json={"records": []})
    assert bad.status_code == 422
    assert await finledger.count() == 2


async def test_a_batch_refused_whole_is_sent_item_by_item(finledger: FinLedger) -> None:
    """A batch the ledger cannot parse (one item without an account) is refused whole (422):
    the client sends each item alone, so only the bad item is permanent."""
    client = DownstreamClient(finledger.url, timeout_s=5)
    bad = _record("acct-a", {"amount": 2}) | {"account_id": ""}
    try:
        attempts = await client.send_batch(
            [("k:good", _record("acct-a", {"amount": 1})), ("k:bad", bad)]
        )
    finally:
        await client.aclose()
    assert [a.outcome for a in attempts] == [Outcome.COMPLETED, Outcome.PERMANENT_FAILURE]
    assert [r["correlation_id"] for r in await finledger.records()] == ["k:good"]
    history = (await finledger.requests())["requests"]
    assert [(h["correlation_id"], h["batch"]) for h in history] == [("k:good", None)]


async def _open_account(store: PayoutStore, ctx: WorkContext, account_id: str) -> None:
    await store.create_account(account_id, ctx)
    await store.fund_account(account_id, 1_000_000, ctx)


async def test_one_permanent_failure_dead_letters_only_that_item(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """One batch, one request: the unknown account's rows become dead letters after one
    attempt, every other row of the same batch is delivered."""
    good = await new_account(store, ctx)
    gone = f"gone-{uuid.uuid4().hex[:8]}"
    await _open_account(store, ctx, gone)
    await post_payout(store, ctx, good)
    await post_payout(store, ctx, gone)
    await finledger.set_faults(unknown_account_prefixes=["gone"])
    rows = await outbox_rows(pool)
    publisher = make_publisher(batch_size=len(rows))
    done = await publisher.process_once()
    assert len(done) == len(rows)
    history = (await finledger.requests())["requests"]
    assert len(history) == len(rows) and {h["batch"] for h in history} == {1}  # one request
    after = await outbox_rows(pool)
    failed = {r["delivery_key"] for r in after if r["status"] == "delivery_failed"}
    delivered = {r["delivery_key"] for r in after if r["status"] == "delivered"}
    gone_keys = {r["delivery_key"] for r in after if gone in r["delivery_key"]}
    assert gone_keys and failed == gone_keys
    assert delivered == {r["delivery_key"] for r in after} - gone_keys
    assert {r["attempts"] for r in after} == {1}
    assert {r["last_outcome"] for r in after if r["status"] == "delivery_failed"} == {
        "permanent_failure"
    }
    booked = {r["correlation_id"] for r in await finledger.records()}
    assert booked == delivered


SLOW = "slow-account"
IDENTITIES: dict[str, Kind] = {"local-operator": "operator", "outbox": "component"}


@pytest.fixture
def ledger_process(tmp_path: Path, run_dir: Path) -> Iterator[tuple[str, dict[str, Path]]]:
    """`python -m finledger` as its own process, with credentials, and a start-up rule that
    holds ONE write of account SLOW's for 3 s, once (FINLEDGER_RULES)."""
    tokens = issue_tokens(tmp_path / "tokens", IDENTITIES)
    creds = write_credentials(tmp_path / "finledger.json", IDENTITIES, tokens)
    port = free_port()
    rules = [{"correlation_prefix": SLOW, "action": "accept", "latency_s": 3, "times": 1}]
    log = run_dir / f"finledger-{port}.log"
    proc = spawn(
        ["-m", "finledger"],
        {
            "FINLEDGER_PORT": str(port),
            "FINLEDGER_CREDENTIALS_PATH": str(creds),
            "FINLEDGER_RULES": json.dumps(rules),
        },
        log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", proc, log)
        yield url, tokens
    finally:
        stop(proc)


async def test_a_batch_redelivered_after_a_timeout_books_each_item_once(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    ledger_process: tuple[str, dict[str, Path]],
) -> None:
    """The ledger holds one item past the publisher's timeout: the whole batch is retryable,
    sent again, and the ledger books every item exactly once (the held one included)."""
    url, tokens = ledger_process
    await _open_account(store, ctx, SLOW)  # its account.opened key starts with SLOW
    await post_payout(store, ctx, SLOW)
    await post_payout(store, ctx, await new_account(store, ctx))
    rows = await outbox_rows(pool)
    settings = outbox_settings(
        url,
        token_file=str(tokens["outbox"]),
        http_timeout_s=1.0,
        lease_s=5.0,
        batch_size=len(rows),
    )
    publisher = Publisher(pool, settings)
    try:
        first = await publisher.process_once()
        assert {str(o) for _, o in first} == {"retryable_failure"}  # the reply never came
        deadline = time.monotonic() + 30
        while await outbox_rows(pool, "status <> 'delivered'"):
            assert time.monotonic() < deadline, "not delivered in time"
            await publisher.drain()
            await asyncio.sleep(0.02)  # the resent rows wait out their short backoff
    finally:
        await publisher.aclose()
    op = {"Authorization": f"Bearer {read_token(token_file=tokens['local-operator'])}"}
    async with httpx.AsyncClient(base_url=url, headers=op, timeout=10) as http:
        # the held write finishes on the ledger's side even though its reply was lost
        deadline = time.monotonic() + 30
        while (await http.get("/admin/requests")).json()["in_flight"]:
            assert time.monotonic() < deadline, "held write never finished"
            await asyncio.sleep(0.05)
        history = (await http.get("/admin/requests")).json()
        records = (await http.get("/v1/records")).json()["records"]
    keys = sorted(r["delivery_key"] for r in await outbox_rows(pool))
    assert sorted(r["correlation_id"] for r in records) == keys  # each booked once
    assert all(history["counts"][k] >= 2 for k in keys)  # every item really sent twice
    answers = {h["answer"] for h in history["requests"]}
    assert "duplicate" in answers  # the redelivery was de-duplicated, not booked again
    assert {r["last_outcome"] for r in await outbox_rows(pool)} <= {
        "completed",
        "duplicate_completed",
    }
