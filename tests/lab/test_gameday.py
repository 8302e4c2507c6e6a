"""The short game day (issue 17) and every runbook executed as written (issue 25), on one stack.

One etcd stack, one Prometheus loading the shipped ops/prometheus/prometheus.yml. First the short
game day: each of its alerts must be seen firing in Prometheus's /api/v1/alerts after its
condition was caused, its runbook section's commands must hold, and it must resolve after
recovery. Then every other scenario as a runbook check: its cause injected, its scenario's own
evidence confirmed, and its alerts' runbook blocks run verbatim (a block that exits non-zero
unless marked `fails:`, prints nothing or hangs fails its row); between them, every alert's
section ran. Negative controls, in the same run: a scenario that causes nothing comes out as
"did not fire" (the detector cannot be fooled by an alert that was never raised), and a runbook
naming a variable `payouts up` does not export is reported by the static check against the live
stack's environment file and fails when run (tests/ops/test_runbooks.py has the runner's own).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.gameday.ctx import Ctx, Scenario
from lab.gameday.rules import alerts
from lab.gameday.run import GamedayOptions, append_table, run_gameday, selected, table
from lab.gameday.runbooks import unexported
from lab.gameday.scenarios import SCENARIOS
from stack.envfile import read_env_file
from tests.ops.test_runbooks import control_book

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus absent: run `make prometheus`"
)


async def _nothing(ctx: Ctx) -> None:
    """Causes no condition at all."""


async def _yes(ctx: Ctx) -> bool:
    return True


async def _inject_unexported(ctx: Ctx) -> None:
    """A runbook whose command names $LOCK_SERVER_URL, which the environment file lacks."""
    ctx.books["control.md"] = control_book(
        "## RunbookNegativeControl\n\n**Confirm.**\n```sh\n"
        'curl -s --max-time 5 "$LOCK_SERVER_URL/health"\n```\n'
    )


async def _reported(ctx: Ctx) -> bool:
    """The static check, on the live stack's environment file, names the variable."""
    exported = set(read_env_file(ctx.stack.env_file))
    problems = unexported([ctx.books["control.md"]], exported)
    return any("$LOCK_SERVER_URL is not exported" in p for p in problems)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(1200)
async def test_short_game_day_fires_and_every_runbook_runs_as_written(
    stack_env: dict[str, str], stack_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    short = selected(short=True)
    assert len(short) >= 3
    silent = Scenario("negative control: nothing caused", ("OutboxDeadLetters",), _nothing,
                      _yes, _nothing)  # fmt: skip
    rest = [s for s in SCENARIOS if s not in short]
    unexported_var = Scenario(
        "negative control: a runbook names an unexported variable",
        ("RunbookNegativeControl",), _inject_unexported, _reported, _nothing,
    )  # fmt: skip
    options = GamedayOptions(run_dir=stack_dir, fire_within_s=30.0, resolve_within_s=90.0)
    lines: list[str] = []
    rows = await run_gameday(options, lines.append, [*short, silent], [*rest, unexported_var])
    fired = rows[: len(short)]
    negative = rows[len(short)]
    checked, bad_runbook = rows[len(short) + 1 : -1], rows[-1]

    assert [r.alert for r in fired] == [a for s in short for a in s.alerts]
    for row in fired:
        assert row.ok, (row.alert, row.problems, lines[-40:])
        assert row.detection_s is not None and row.recovery_s is not None
    assert not negative.ok
    assert negative.detection_s is None
    assert any("did not fire" in p for p in negative.problems)

    assert [r.alert for r in checked] == [a for s in rest for a in s.alerts]
    for row in checked:
        assert row.ok, (row.alert, row.problems, lines[-40:])
    assert {r.alert for r in [*fired, *checked]} == set(alerts())  # every section ran
    assert all(r.blocks_run >= 1 for r in [*fired, *checked])
    assert not bad_runbook.ok and bad_runbook.confirmed  # the static check reported it, and
    assert any("LOCK_SERVER_URL: unbound variable" in p for p in bad_runbook.problems)

    doc = stack_dir / "gameday.md"
    append_table(doc, table(fired, short=True))
    text = doc.read_text()
    assert all(f"[{r.alert}]" in text for r in fired)
    assert re.search(r"\| yes \(\d+ commands?\) \| ok \|", text)


def test_gameday_cli_has_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lab", "gameday", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--all" in out.stdout and "docs/gameday.md" in out.stdout
