"""`payouts check-invariants` end to end against the real database, stub and lock server: the
JSON report and the exit status (0 clean, 1 violations, 2 a source could not be read)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.testing import WorkflowEnvironment

from common.db_roles import CHECKER
from lockservice.server import create_app
from payouts import invariants_cli
from payouts.cli import main
from stack.embedded.shared import free_port
from tests.conftest import as_role, last_json_line
from tests.invariants.conftest import World
from tests.lockservice.server_fixtures import serve_app


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    # configure_logging binds structlog to the stderr of the moment (pytest's capture stream);
    # later tests would then log to a closed file. The CLI's output under test is stdout.
    monkeypatch.setattr(invariants_cli, "configure_logging", lambda component: None)


async def test_check_prints_json_and_exit_status(
    world: World, capsys: pytest.CaptureFixture[str], temporal_env: WorkflowEnvironment
) -> None:
    """Clean: exit 0 and ten zeros, every rule checked (Temporal asked, --settled); after a
    duplicate movement: exit 1 and INV-02 = 1."""
    a = await world.account()
    payout_id = await world.pay(a, 1000)
    temporal = temporal_env.client.service_client.config.target_host
    argv = ["check-invariants", "--json", "--database-url", as_role(world.url, CHECKER),
            "--rail-admin-url", world.stub.url, "--temporal", temporal, "--settled"]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 0
    clean = last_json_line(capsys)
    assert clean["ok"] is True and set(clean["counts"].values()) == {0}
    assert len(clean["counts"]) == 10
    assert clean["not_checked"] == []

    await world.stub_payment(payout_id, a)
    async with serve_app(create_app(world.locks)) as lock_url:
        http_argv = [*argv, "--history", "http", "--lock-url", lock_url]
        assert await asyncio.to_thread(main, http_argv) == 1
    broken = last_json_line(capsys)
    assert broken["counts"]["INV-02"] == 1
    assert broken["invariants"]["INV-02"]["sample"] == [f"{payout_id}: 2 rail movements"]


async def test_check_exits_2_when_a_source_is_unreadable(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreachable rail log, lock server or Temporal is an error (exit 2), never a clean
    report; `--no-workflows` skips Temporal and says so."""
    dead = f"http://127.0.0.1:{free_port()}"
    base = ["check-invariants", "--database-url", as_role(world.url, CHECKER), "--no-workflows"]
    assert await asyncio.to_thread(main, [*base, "--rail-admin-url", dead]) == 2
    argv = [*base, "--rail-admin-url", world.stub.url, "--history", "http", "--lock-url", dead]
    assert await asyncio.to_thread(main, argv) == 2
    no_temporal = ["check-invariants", "--database-url", as_role(world.url, CHECKER)]
    no_temporal += ["--rail-admin-url", world.stub.url, "--temporal", f"127.0.0.1:{free_port()}"]
    assert await asyncio.to_thread(main, no_temporal) == 2
    assert "OK" not in capsys.readouterr().out
    assert await asyncio.to_thread(main, [*base, "--rail-admin-url", world.stub.url]) == 0
    out = capsys.readouterr().out
    assert "not checked: INV-10 closed workflows (no Temporal address given)" in out
