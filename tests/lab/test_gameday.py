"""The short game day (issue 17): a real stack, a real Prometheus, three alerts caused for real.

Each alert must be seen firing in Prometheus's /api/v1/alerts after its condition was caused,
its runbook's confirm step must hold, and it must resolve after recovery. Negative control: a
scenario that causes nothing must come out as "did not fire" (the detector cannot be fooled by
an alert that was never raised), in the same run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.gameday import GamedayOptions, append_table, run_gameday, selected, table
from lab.gameday_ctx import Ctx, Scenario

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus absent: run `make prometheus`"
)


async def _nothing(ctx: Ctx) -> None:
    """Causes no condition at all."""


async def _yes(ctx: Ctx) -> bool:
    return True


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_short_game_day_fires_confirms_and_recovers(
    stack_env: dict[str, str], stack_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    short = selected(short=True)
    assert len(short) >= 3
    control = Scenario("negative control: nothing caused", ("OutboxDeadLetters",), _nothing,
                       _yes, _nothing)  # fmt: skip
    options = GamedayOptions(run_dir=stack_dir, fire_within_s=30.0, resolve_within_s=60.0)
    rows = await run_gameday(options, lambda _line: None, [*short, control])
    *real, negative = rows
    assert [r.alert for r in real] == [a for s in short for a in s.alerts]
    for row in real:
        assert row.ok, (row.alert, row.problems)
        assert row.detection_s is not None and row.recovery_s is not None
    assert not negative.ok
    assert negative.detection_s is None
    assert any("did not fire" in p for p in negative.problems)
    doc = stack_dir / "gameday.md"
    append_table(doc, table(real, short=True))
    text = doc.read_text()
    assert all(f"[{r.alert}]" in text for r in real)
    assert re.search(r"\| yes \(\d+ commands?\) \| ok \|", text)


def test_gameday_cli_has_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "payouts.cli", "gameday", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--all" in out.stdout and "docs/gameday.md" in out.stdout
