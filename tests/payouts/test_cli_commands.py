"""`payouts seed` and `payouts payout create`: real PostgreSQL; bad input creates nothing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from lockservice.server import LockSettings, app_from_settings
from payouts.cli import main
from tests.credentials import OPERATOR, credentials, token, token_file
from tests.grants import TEST_KID, grant_keys
from tests.servers import ServerThread
from workflows.search_attributes import query


async def count_payouts(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM paydb.payouts"))
    finally:
        await conn.close()


def seed(db: str, prefix: str, *, accounts: int, balance: int) -> None:
    """`payouts seed` must succeed: every test starts from accounts of its own."""
    argv = ["seed", "--database-url", db, "--prefix", prefix]
    assert main([*argv, "--accounts", str(accounts), "--balance", str(balance)]) == 0


def test_seed_then_create_a_csv_batch(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seeding funds accounts; a CSV batch creates every payout row."""
    prefix = f"a{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=2, balance=5000)
    before = asyncio.run(count_payouts(db))
    batch = tmp_path / "batch.csv"
    batch.write_text(
        f"payout_id,account_id,amount\np-{prefix}1,{prefix}00000,100\np-{prefix}2,{prefix}00001,200\n"
    )
    assert main(["payout", "create", "--database-url", db, "--file", str(batch), "--no-start"]) == 0
    assert asyncio.run(count_payouts(db)) == before + 2
    assert "created 2 payout(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        (
            '[{"payout_id": "x1", "account_id": "ACCOUNT", "amount": 10}, {"payout_id": "x2", "account_id": "nope", "amount": 10}]',
            ".json",
            "unknown account",
        ),
        (
            '[{"payout_id": "x1", "account_id": "ACCOUNT", "amount": -5}]',
            ".json",
            "amount must be positive",
        ),
        (
            '[{"payout_id": "x1", "account_id": "ACCOUNT", "amount": 10}, {"payout_id": "x1", "account_id": "ACCOUNT", "amount": 10}]',
            ".json",
            "appears twice",
        ),
        ("{not json", ".json", "invalid JSON"),
        ("payout_id,account_id,amount\nx1,ACCOUNT,ten\n", ".csv", "not an integer"),
        ("payout_id,account_id\nx1,ACCOUNT\n", ".csv", "missing field"),
        ("[]", ".json", "no payouts given"),
    ],
)
def test_bad_batches_create_nothing(
    db: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    suffix: str,
    message: str,
) -> None:
    """Every malformed batch is refused whole with a clear message; no row is written."""
    prefix = f"b{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    capsys.readouterr()
    before = asyncio.run(count_payouts(db))
    batch = tmp_path / f"bad{suffix}"
    batch.write_text(
        content.replace("ACCOUNT", f"{prefix}00000")
        .replace("x1", f"x1-{prefix}")
        .replace("x2", f"x2-{prefix}")
    )
    assert main(["payout", "create", "--database-url", db, "--file", str(batch), "--no-start"]) == 2
    assert message in capsys.readouterr().err
    assert asyncio.run(count_payouts(db)) == before


def test_operator_signal_requires_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """abandon with a blank reason is refused before anything is sent."""
    assert main(["payout", "abandon", "po-1", "--operator", "ana", "--reason", "  "]) == 2
    assert "--reason is required" in capsys.readouterr().err


def test_json_batch_is_accepted(db: str, tmp_path: Path) -> None:
    """A JSON list batch is read with the same rules as CSV."""
    prefix = f"c{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    batch = tmp_path / "ok.json"
    batch.write_text(
        json.dumps([{"payout_id": f"j-{prefix}", "account_id": f"{prefix}00000", "amount": 5}])
    )
    assert main(["payout", "create", "--database-url", db, "--file", str(batch), "--no-start"]) == 0


def test_single_payout_needs_account_and_amount(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`payout create --amount 5` without --account says what is missing; nothing is created."""
    before = asyncio.run(count_payouts(db))
    assert main(["payout", "create", "--database-url", db, "--amount", "5", "--no-start"]) == 2
    err = capsys.readouterr().err
    assert "needs --account and --amount" in err and "None" not in err
    assert asyncio.run(count_payouts(db)) == before


def test_unreachable_temporal_creates_nothing(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """With Temporal unreachable, create fails with one line and exit 5 before writing a row, so
    a retry is not refused as a duplicate."""
    prefix = f"d{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    capsys.readouterr()
    before = asyncio.run(count_payouts(db))
    argv = ["payout", "create", "--database-url", db, "--temporal", "127.0.0.1:1"]
    assert main([*argv, "--account", f"{prefix}00000", "--amount", "5"]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Temporal at 127.0.0.1:1 is unreachable" in err[0]
    assert asyncio.run(count_payouts(db)) == before


def test_start_pending_starts_each_missing_workflow_once(
    db: str, temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PENDING payout without a workflow (created with --no-start, as after a failed start) is
    started by `payout start-pending`, keyed by its workflow id: a second run starts nothing."""
    address = temporal_env.client.service_client.config.target_host
    prefix = f"e{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    create = ["payout", "create", "--database-url", db, "--account", f"{prefix}00000"]
    assert main([*create, "--amount", "5", "--payout-id", f"{prefix}p", "--no-start"]) == 0
    capsys.readouterr()
    queue = f"q-{uuid.uuid4()}"  # nothing polls it: the workflow just waits
    pending = ["payout", "start-pending", "--database-url", db, "--temporal", address]
    assert main([*pending, "--task-queue", queue]) == 0
    first = capsys.readouterr().out
    assert main([*pending, "--task-queue", queue]) == 0
    second = capsys.readouterr().out
    assert "started 0 workflow(s)" not in first
    assert "started 0 workflow(s)" in second
    handle = temporal_env.client.get_workflow_handle(f"payout-{prefix}p")
    assert (asyncio.run(_describe_status(handle))) == "RUNNING"
    # Findable by state from the start: in Temporal by its search attributes (set by the
    # starter), and by `payout list`, which reads the payment database.
    deadline = time.monotonic() + 30
    found: list[str] = []
    while not found and time.monotonic() < deadline:
        found = asyncio.run(_listed(temporal_env, query("PENDING", f"{prefix}00000")))
        time.sleep(0.2)
    assert found == [f"payout-{prefix}p"]
    listing = ["payout", "list", "--state", "PENDING", "--account", f"{prefix}00000"]
    capsys.readouterr()
    assert main([*listing, "--database-url", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["payout_id"], r["state"], r["amount"]) for r in rows] == [
        (f"{prefix}p", "PENDING", 5)
    ]
    assert main([*listing, "--state", "NOPE", "--database-url", db]) == 2


async def _listed(env: WorkflowEnvironment, visibility_query: str) -> list[str]:
    return [wf.id async for wf in env.client.list_workflows(visibility_query)]


async def _describe_status(handle: Any) -> str:
    return str((await handle.describe()).status.name)


@pytest.fixture(scope="module")
def lock_url(db: str) -> Iterator[str]:
    """A real lock server (its own `app_from_settings`, PostgreSQL backend, the test signing key
    and the generated credentials), for the assertions `payouts payout revoke|abandon` obtain."""
    settings = LockSettings().model_copy(
        update={
            "backend": "postgres",
            "database_url": db,
            "key_prefix": f"cli-{uuid.uuid4().hex[:6]}/",
            "signing_key_path": str(grant_keys().private_path),
            "signing_key_id": TEST_KID,
            "credentials_path": str(credentials().servers["lock-server"]),
        }
    )
    server = ServerThread(app_from_settings(settings))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAYOUTS_OPERATOR_TOKEN", raising=False)
    monkeypatch.setenv("PAYOUTS_OPERATOR_TOKEN_FILE", token_file(OPERATOR))


def test_unknown_and_completed_payouts_have_their_own_exit_codes(
    db: str,
    temporal_env: WorkflowEnvironment,
    lock_url: str,
    operator_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """status of an unknown payout exits 3; a signal to a payout whose workflow has ended exits 4;
    each with one line on stderr and no traceback."""
    address = temporal_env.client.service_client.config.target_host
    status = ["payout", "status", f"nope-{uuid.uuid4().hex[:6]}", "--database-url", db]
    assert main([*status, "--temporal", address]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: unknown payout") and "Traceback" not in err
    prefix = f"f{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    create = ["payout", "create", "--database-url", db, "--temporal", address]
    create += ["--task-queue", f"q-{uuid.uuid4()}", "--account", f"{prefix}00000"]
    assert main([*create, "--amount", "5", "--payout-id", f"{prefix}p"]) == 0
    asyncio.run(_terminate(address, f"payout-{prefix}p"))
    capsys.readouterr()
    signal = ["payout", "abandon", f"{prefix}p", "--reason", "test", "--lock-url", lock_url]
    assert main([*signal, "--temporal", address]) == 4
    assert "has completed" in capsys.readouterr().err


async def _signals(address: str, workflow_id: str) -> list[dict[str, Any]]:
    """The payloads of every signal in the workflow's history, decoded as JSON."""
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    out = []
    for event in history.events:
        if event.HasField("workflow_execution_signaled_event_attributes"):
            attrs = event.workflow_execution_signaled_event_attributes
            out += [json.loads(p.data) for p in attrs.input.payloads]
    return out


def _started_without_worker(db: str, address: str) -> str:
    """A payout whose workflow runs on a queue no worker polls: signals just land in history."""
    prefix = f"s{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    create = ["payout", "create", "--database-url", db, "--temporal", address]
    create += ["--task-queue", f"q-{uuid.uuid4()}", "--account", f"{prefix}00000"]
    assert main([*create, "--amount", "5", "--payout-id", f"{prefix}p"]) == 0
    return f"{prefix}p"


def test_operator_signal_carries_the_lock_servers_assertion_and_no_secret(
    db: str,
    temporal_env: WorkflowEnvironment,
    lock_url: str,
    operator_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`payouts payout revoke --signal` obtains an operator assertion with the operator's token
    and sends it in the signal: the history holds the asserted identity (not `--operator`),
    bound to this payout, action and its account's lock key, and never the token."""
    address = temporal_env.client.service_client.config.target_host
    payout_id = _started_without_worker(db, address)
    capsys.readouterr()
    argv = ["payout", "revoke", payout_id, "--signal", "--operator", "mallory"]
    argv += ["--reason", "stuck holder"]
    assert main([*argv, "--lock-url", lock_url, "--temporal", address]) == 0
    assert f"as {OPERATOR}" in capsys.readouterr().out
    (sent,) = asyncio.run(_signals(address, f"payout-{payout_id}"))
    assert sent["operator"] == OPERATOR and sent["reason"] == "stuck holder"
    a = sent["assertion"]
    assert (a["identity"], a["action"], a["payout_id"]) == (OPERATOR, "revoke", payout_id)
    assert a["key"] == f"payout:{payout_id.removesuffix('p')}00000"
    assert token(OPERATOR) not in json.dumps(sent)


def test_operator_signal_without_the_lock_server_sends_nothing(
    db: str,
    temporal_env: WorkflowEnvironment,
    lock_url: str,
    operator_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Lock server unreachable: one line, exit 5, no signal. No operator token: exit 2, no
    signal. A component's token: refused by the lock server (403), exit 2, no signal."""
    address = temporal_env.client.service_client.config.target_host
    payout_id = _started_without_worker(db, address)
    capsys.readouterr()
    argv = ["payout", "abandon", payout_id, "--reason", "sla", "--temporal", address]
    assert main([*argv, "--lock-url", "http://127.0.0.1:1"]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lock server at http://127.0.0.1:1 unreachable" in err[0]
    monkeypatch.setenv("PAYOUTS_OPERATOR_TOKEN_FILE", token_file("worker"))
    assert main([*argv, "--lock-url", lock_url]) == 2
    assert "HTTP 403" in capsys.readouterr().err
    monkeypatch.delenv("PAYOUTS_OPERATOR_TOKEN_FILE")
    assert main([*argv, "--lock-url", lock_url]) == 2
    assert "no operator token" in capsys.readouterr().err
    assert asyncio.run(_signals(address, f"payout-{payout_id}")) == []


async def _terminate(address: str, workflow_id: str) -> None:
    from temporalio.client import Client

    client = await Client.connect(address)
    await client.get_workflow_handle(workflow_id).terminate(reason="test: an ended workflow")


def test_wait_follows_until_its_timeout_and_says_what_is_left(
    db: str, temporal_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """`payout create --wait` draws progress from the payouts' real states; with nothing to run
    them (no worker polls the queue), it stops at --wait-timeout with exit 6 and a summary that
    shows them still PENDING."""
    address = temporal_env.client.service_client.config.target_host
    prefix = f"g{uuid.uuid4().hex[:5]}-"
    seed(db, prefix, accounts=1, balance=100)
    capsys.readouterr()
    argv = ["payout", "create", "--database-url", db, "--temporal", address]
    argv += ["--task-queue", f"q-{uuid.uuid4()}", "--account", f"{prefix}00000", "--amount", "5"]
    assert main([*argv, "--wait", "--wait-timeout", "1.5"]) == 6
    captured = capsys.readouterr()
    assert "0/1 terminal  PENDING=1" in captured.err
    assert "summary: PENDING 1" in captured.out
