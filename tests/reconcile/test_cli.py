"""`payouts reconcile run` end to end against the real database and stub: the JSON report, the
exit status, and clear refusals of bad windows and durations."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import timedelta

import pytest

from common.db_roles import RECONCILER
from payouts import reconcile_cli
from payouts.cli import main
from reconcile.rules import CLASSES
from tests.conftest import as_role
from tests.reconcile.conftest import World


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    # configure_logging binds structlog to the stderr of the moment (pytest's capture stream);
    # later tests would then log to a closed file. The CLI's output under test is stdout.
    monkeypatch.setattr(reconcile_cli, "configure_logging", lambda component: None)


def last_json_line(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    # Without configure_logging, structlog's default prints events to stdout before the report.
    out: dict[str, object] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out


async def test_run_prints_json_report_and_exit_status(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A clean window exits 0 with seven zeros; a window with a stray movement exits 1."""
    start = await world.db_now() - timedelta(milliseconds=1)
    await world.pay(1000)
    end = await world.db_now()
    argv = [
        "reconcile", "run", "--json",
        "--database-url", as_role(world.url, RECONCILER),
        "--rail-admin-url", world.stub.url,
        "--window-start", start.isoformat(),
        "--window-end", end.isoformat(),
    ]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 0
    clean = last_json_line(capsys)
    assert clean["counts"] == {c: 0 for c in CLASSES} and clean["ok"] is True
    assert clean["checked_payouts"] == 1 and clean["window"]["end"] == end.isoformat()

    movement_id = await world.stub_payment("stray-cli")
    # The stray movement carries the rail's timestamp: reconcile a window that contains it.
    argv[argv.index("--window-end") + 1] = (await world.db_now()).isoformat()
    assert await asyncio.to_thread(main, argv) == 1
    broken = last_json_line(capsys)
    assert broken["samples"]["movement_without_attempt"] == [movement_id]


async def test_run_refuses_an_open_window(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """A window ending in the future is refused with exit status 2 and nothing reconciled."""
    now = await world.db_now()
    argv = [
        "reconcile", "run",
        "--database-url", as_role(world.url, RECONCILER),
        "--rail-admin-url", world.stub.url,
        "--window-start", now.isoformat(),
        "--window-end", (now + timedelta(hours=1)).isoformat(),
    ]  # fmt: skip
    assert await asyncio.to_thread(main, argv) == 2
    assert "window" in capsys.readouterr().err


def test_durations_and_instants_are_validated() -> None:
    """--every accepts 1h/30m/90s forms only; window bounds need a time zone."""
    assert reconcile_cli.parse_duration("1h30m") == timedelta(minutes=90)
    assert reconcile_cli.parse_duration("90s") == timedelta(seconds=90)
    for bad in ("", "0s", "1x", "h", "-1h"):
        with pytest.raises(argparse.ArgumentTypeError):
            reconcile_cli.parse_duration(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        reconcile_cli.parse_instant("2026-01-01T00:00:00")
    assert reconcile_cli.parse_instant("2026-01-01T00:00:00Z").utcoffset() == timedelta(0)
