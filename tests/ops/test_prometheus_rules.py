"""The alert rules are valid, unit-tested by promtool, and each one is operable (issue 17).

`promtool check rules` and `promtool test rules` run on the repository's files; every alert has a
severity, a summary and a runbook_url whose section exists, is exercised both firing and
silent in ops/prometheus/rules_test.yml, and has a game-day scenario. Negative control: a rules
file whose alert loses its runbook_url, or a test expecting an alert that cannot fire, fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lab.gameday.prom import GAMEDAY_WINDOWS, OPS_DIR, render_rules
from lab.gameday.rules import alerts
from lab.gameday.run import selected
from lab.gameday.scenarios import SCENARIOS

ROOT = OPS_DIR.parent.parent
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool absent: run `make prometheus` (Debian, root)"
)


def _promtool(*args: str, cwd: Path = OPS_DIR) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_checks_every_rule_file() -> None:
    files = ["rules.yml", "thresholds.yml", "gameday-thresholds.yml"]
    result = _promtool("check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = _promtool("test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_fail_when_an_alert_is_broken(tmp_path: Path) -> None:
    """Negative control: the same tests against a rule that can never fire fail."""
    for name in ("rules_test.yml", "thresholds.yml"):
        shutil.copy(OPS_DIR / name, tmp_path / name)
    broken = (
        (OPS_DIR / "rules.yml")
        .read_text()
        .replace("expr: max(outbox_dead_letters) > 0", "expr: max(outbox_dead_letters) > 1e9")
    )
    (tmp_path / "rules.yml").write_text(broken)
    result = _promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "OutboxDeadLetters" in result.stdout + result.stderr


def _anchors(markdown: str) -> set[str]:
    return {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M)
    }


def test_every_alert_has_severity_summary_and_its_own_runbook_section() -> None:
    rules = alerts()
    assert len(rules) >= 10
    urls = set()
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"page", "ticket"}, name
        assert rule["annotations"]["summary"].strip(), name
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert anchor == name.lower(), (name, url)  # its own section, not a shared one
        assert anchor in _anchors((ROOT / path).read_text()), (name, url)
        urls.add(url)
    assert len(urls) == len(rules)


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    doc = yaml.safe_load((OPS_DIR / "rules_test.yml").read_text())
    fires: set[str] = set()
    silent: set[str] = set()
    for test in doc["tests"]:
        for case in test["alert_rule_test"]:
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    assert set(alerts()) <= fires, set(alerts()) - fires
    assert set(alerts()) <= silent, set(alerts()) - silent


def test_every_alert_has_a_game_day_scenario() -> None:
    covered = {a for s in SCENARIOS for a in s.alerts}
    missing = set(alerts()) - covered
    assert not missing, missing  # every alert is caused for real by a game-day scenario
    assert covered <= set(alerts())


def test_game_day_selection_by_word() -> None:
    """`--only` picks scenarios by name or alert; the short set stays what `make test` runs."""
    assert len(selected(short=True)) == 3
    picked = selected(short=False, only="fencedoutwrite, ReconciliationDiscrepancies")
    assert [a for s in picked for a in s.alerts] == [
        "FencedOutWrite",
        "ReconciliationDiscrepancies",
    ]
    assert selected(short=True, only="FencedOutWrite") == []  # not in the short set
    assert selected(short=False, only="no-such-scenario") == []


def test_game_day_rendering_shortens_every_window_and_for() -> None:
    text = (OPS_DIR / "rules.yml").read_text()
    rendered = render_rules(text, for_s=3)
    windows = set(re.findall(r"\[(\d+[smhd])\]", text)) | set(
        re.findall(r"offset (\d+[smhd])", text)
    )
    assert windows <= set(GAMEDAY_WINDOWS), windows - set(GAMEDAY_WINDOWS)
    assert not re.findall(r"\[(?:5m|10m|30m|1h|6h|1d)\]", rendered)
    assert set(re.findall(r"\n\s+for: (\S+)", rendered)) == {"3s"}
    assert yaml.safe_load(rendered)["groups"]
