"""`payouts payout status|show`, `payouts audit`, the stack's environment file and the stack
check, through the real console script against real PostgreSQL and real Temporal dev servers.

The stack check runs against a Temporal dev server of this module's own (`foreign_temporal`):
marking the session's would change what every other test's Temporal says it is.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from common.stackmark import mark_database, mark_temporal
from payouts.errors import EXIT
from stack.embedded.shared import free_port
from stack.embedded.temporal import temporal_binary
from stack.envfile import write_env_file
from tests.payouts.test_exit_table import clean_env, one_line, payouts
from workflows.search_attributes import SEARCH_ATTRIBUTES


@pytest.fixture(scope="module")
async def foreign_temporal() -> AsyncIterator[str]:
    """A second real Temporal dev server: another stack's, as far as a command can tell."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        ui=False,
    )
    try:
        yield env.client.service_client.config.target_host
    finally:
        await env.shutdown()


async def _count(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM paydb.payouts"))
    finally:
        await conn.close()


async def _mark_temporal(address: str, stack_id: str) -> None:
    from temporalio.client import Client

    await mark_temporal(await Client.connect(address), stack_id)


def _seeded(db: str) -> str:
    prefix = f"t{uuid.uuid4().hex[:5]}-"
    done = payouts("seed", "--database-url", db, "--prefix", prefix, "--accounts", "1")
    assert done.returncode == 0, done.stderr
    return f"{prefix}00000"


def test_status_show_and_audit_answer_in_text_and_json(
    db: str, temporal_env: WorkflowEnvironment
) -> None:
    """A started payout whose queue no worker polls: `status` in text names its state, account
    and amount from the database and says which queue no worker answered on; `--json` is one
    object; the workflow id as `payout list` prints it works the same; `show` adds the audit
    rows, and `payouts audit --payout` prints them without psql. (The workflow's own answer, with
    a worker, is worded as tests/payouts/test_status_render_unit.py shows.)"""
    address = temporal_env.client.service_client.config.target_host
    account = _seeded(db)
    payout_id = f"st-{uuid.uuid4().hex[:6]}"
    queue = f"q-{uuid.uuid4()}"
    create = ["payout", "create", "--database-url", db, "--temporal", address]
    create += ["--task-queue", queue, "--account", account, "--amount", "2500"]
    assert payouts(*create, "--payout-id", payout_id).returncode == 0
    env = clean_env(TEMPORAL_ADDRESS=address, PAYDB_DATABASE_URL=db)

    text = payouts("payout", "status", payout_id, env=env)
    assert text.returncode == 0, text.stderr
    assert f"payout {payout_id}  (workflow payout-{payout_id})" in text.stdout
    assert "state        PENDING" in text.stdout
    assert f"account      {account}  amount 2500 (minor units)" in text.stdout
    assert "its workflow is RUNNING but no worker answered" in text.stdout
    assert f"task queue {queue}" in text.stdout
    assert "database     state PENDING" in text.stdout
    assert "{" not in text.stdout  # never a dict repr

    as_json = payouts("payout", "status", f"payout-{payout_id}", "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["payout_id"] == payout_id and report["workflow"] is None
    assert report["database"]["amount"] == 2500 and report["database"]["state"] == "PENDING"
    assert queue in report["workflow_note"] and report["failure"] is None

    show = payouts("payout", "show", payout_id, env=env)
    assert show.returncode == 0, show.stderr
    assert "audit        1 row(s)" in show.stdout and "payout.created" in show.stdout
    audit = payouts("audit", "--payout", f"payout-{payout_id}", "--json", env=env)
    rows = json.loads(audit.stdout)
    assert [r["action"] for r in rows] == ["payout.created"], rows
    assert rows[0]["payout_id"] == payout_id

    # Without a DSN, status says the row was not read; still exit 0 with what it knows.
    bare = payouts("payout", "status", payout_id, env=clean_env(TEMPORAL_ADDRESS=address))
    assert bare.returncode == 0, bare.stderr
    assert "database     not read" in bare.stdout and "state        unknown" in bare.stdout


def test_the_stack_environment_file_is_read_and_a_set_variable_wins(
    db: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """With the variables unset, the command takes them from the stack's environment file and
    says so; a variable set in the shell wins over the file."""
    address = temporal_env.client.service_client.config.target_host
    env_file = tmp_path / "stack.env"
    write_env_file(
        env_file, {"TEMPORAL_ADDRESS": address, "PAYDB_DATABASE_URL": db}, header="test stack"
    )
    nope = f"nope-{uuid.uuid4().hex[:6]}"
    done = payouts("payout", "status", nope, env={**clean_env(), "PAYOUTS_ENV_FILE": str(env_file)})
    assert done.returncode == EXIT["not_found"], done.stderr  # it reached the file's Temporal
    note, error = done.stderr.strip().splitlines()
    assert (
        note
        == f"note: TEMPORAL_ADDRESS, PAYDB_DATABASE_URL from {env_file} (a variable set in the shell wins)"
    )
    assert error.startswith(f"error: unknown payout {nope}")
    port = free_port()
    env = {
        **clean_env(),
        "PAYOUTS_ENV_FILE": str(env_file),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
    }
    done = payouts("payout", "status", nope, env=env)
    assert done.returncode == EXIT["unavailable"]
    assert f"Temporal at 127.0.0.1:{port} is unreachable" in done.stderr
    assert "note: PAYDB_DATABASE_URL from" in done.stderr


def test_a_database_and_a_temporal_of_two_stacks_are_refused_before_writing(
    db: str, foreign_temporal: str
) -> None:
    """The database marked as stack A beside a Temporal unmarked, then marked B: `payout create`
    and `start-pending` exit `usage` with one line naming both, and no row is written. The
    control: both marked A, the same create is written and started."""
    account = _seeded(db)
    create = ["payout", "create", "--database-url", db, "--temporal", foreign_temporal]
    create += ["--task-queue", f"q-{uuid.uuid4()}", "--account", account, "--amount", "5"]
    pending = ["payout", "start-pending", "--database-url", db, "--temporal", foreign_temporal]
    asyncio.run(mark_database(db, "aaaa"))
    try:
        for temporal_id in (None, "bbbb"):
            if temporal_id:
                asyncio.run(_mark_temporal(foreign_temporal, temporal_id))
            before = asyncio.run(_count(db))
            for argv in (create, pending):
                done = payouts(*argv)
                assert done.returncode == EXIT["usage"], done.stderr
                line = one_line(done)
                assert (
                    f"the Temporal at {foreign_temporal} is stack {temporal_id or '(none)'}'s"
                    in line
                )
                assert "is stack aaaa's: nothing was written" in line
            assert asyncio.run(_count(db)) == before
        asyncio.run(_mark_temporal(foreign_temporal, "aaaa"))
        done = payouts(*create)
        assert done.returncode == 0, done.stderr
        assert asyncio.run(_count(db)) == before + 1
    finally:
        asyncio.run(_clear_mark(db))


async def _clear_mark(db: str) -> None:
    """The module's database unmarked again, as the session's Temporal is."""
    conn = await asyncpg.connect(db)
    try:
        await conn.execute("COMMENT ON SCHEMA paydb IS NULL")
    finally:
        await conn.close()
