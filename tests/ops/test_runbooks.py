"""Every runbook command is executed as written (issue 25, NFR-11; docs/runbooks/README.md).

Static: every alert has a runbook section with command blocks, every block follows the marker
convention, every `curl` in the docs has a timeout. Live: one etcd stack, the game day's
scenarios outside the short set (the short game day, tests/lab/test_gameday.py, runs the
others' sections), each cause injected and its alerts' blocks run verbatim; a block that exits
non-zero (unless marked `fails:`), prints nothing or hangs fails its row. Negative controls: a
runbook naming a variable `payouts up` does not export is reported by the static check and
fails when run against the live stack; a block that prints nothing, one that hangs and one
marked `fails:` that succeeds are each caught.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from lab.gameday import GamedayOptions, run_gameday, selected
from lab.gameday_ctx import Ctx, Scenario
from lab.gameday_rules import alerts
from lab.gameday_runbooks import (
    RUNBOOKS,
    Runbook,
    RunbookError,
    block_env,
    parse,
    run_block,
    runbooks,
    section_of,
    unexported,
)
from lab.gameday_scenarios import SCENARIOS
from stack.envfile import read_env_file

ROOT = RUNBOOKS.parent.parent
SETUP = '```sh\n. "${PAYOUTS_ENV_FILE:-.run/stack/stack.env}"\n```\n'
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus absent: run `make prometheus`"
)


def _book(text: str, name: str = "control.md") -> Runbook:
    return parse(Path(name), "# control\n\n" + SETUP + text)


def test_every_alert_has_a_runbook_section_with_commands() -> None:
    books = runbooks()
    for alert in alerts():
        book, blocks = section_of(alert, books)
        assert blocks, alert
        assert {b.phase for b in blocks} <= {"confirm", "do", "verify"}
        assert book.setup.code.strip().startswith(". "), book.path  # sources the env file


def test_markers_follow_the_convention() -> None:
    book = _book(
        "## A\n\n**Confirm.**\n```sh timeout=90 fails: the backend is down\nfalse\n```\n"
        "**Verify recovery.**\n```sh\necho ok\n```\n"
    )
    first, second = book.blocks
    assert (first.phase, first.timeout_s, first.expect_fail) == (
        "confirm",
        90,
        "the backend is down",
    )
    assert (second.phase, second.expect_fail) == ("verify", None)
    with pytest.raises(RunbookError, match="unknown marker"):
        _book("## A\n\n**Confirm.**\n```sh maybe\ntrue\n```\n")
    with pytest.raises(RunbookError, match="outside"):
        _book("## A\n\n```sh\ntrue\n```\n")  # no phase: where would it run?


def test_the_static_check_reports_a_variable_payouts_up_does_not_export() -> None:
    """Negative control: the checker names the block and the variable; loop and read variables
    set by the block itself are not reported."""
    exported = {"LOCK_URL", "WORKER_URLS"}
    good = _book(
        "## A\n\n**Confirm.**\n```sh\nfor url in $WORKER_URLS; do curl -s --max-time 5 "
        '"$url/health"; done\n```\n```sh\ncurl -s --max-time 5 "$LOCK_URL/health"\n```\n'
    )
    assert unexported([good], exported) == []
    bad = _book(
        '## A\n\n**Confirm.**\n```sh\ncurl -s --max-time 5 "$LOCK_SERVER_URL/health"\n```\n'
    )
    assert unexported([bad], exported) == [
        "control.md:9 (A, confirm): $LOCK_SERVER_URL is not exported by `payouts up`"
    ]


_CURL = re.compile(r"\bcurl\s+[^\s`][^\n`]*")


def curls_without_timeout(text: str) -> list[str]:
    return [c for c in _CURL.findall(text) if not re.search(r"(--max-time|\s-m)\s*\d", c)]


def test_every_curl_in_the_docs_has_a_timeout() -> None:
    """A runbook for a frozen server must not hang; negative control: a bare curl is found."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bare = {str(p.relative_to(ROOT)): curls_without_timeout(p.read_text()) for p in docs}
    assert not {p: c for p, c in bare.items() if c}
    assert curls_without_timeout("run `curl -s $LOCK_URL/health` now") == [
        "curl -s $LOCK_URL/health"
    ]


async def test_a_block_that_fails_prints_nothing_or_hangs_is_caught(tmp_path: Path) -> None:
    """Negative controls of the runner, in real bash: each way a block can be wrong is caught,
    and a correct one passes."""
    env_file = tmp_path / "stack.env"
    env_file.write_text("export LOCK_URL=http://127.0.0.1:1\n")
    book = _book(
        "## A\n\n**Confirm.**\n"
        '```sh\necho "$LOCK_URL"\n```\n'  # fine
        "```sh\ntrue\n```\n"  # prints nothing
        "```sh timeout=1\nsleep 30\n```\n"  # hangs
        "```sh fails: the backend is down\necho up\n```\n"  # marked to fail, succeeds
        '```sh\necho "$NOT_EXPORTED"\n```\n'  # unbound under set -u
        "```sh\necho before; false; echo after\n```\n"  # set -e stops at the failure
    )
    env = block_env(env_file)
    outcomes = [await run_block(book, b, env) for b in book.blocks]
    problems = [o.problem for o in outcomes]
    assert problems[0] is None and outcomes[0].output.strip() == "http://127.0.0.1:1"
    assert problems[1] is not None and "printed nothing" in problems[1]
    assert problems[2] is not None and "hung past its 1s timeout" in problems[2]
    assert problems[3] is not None and "marked `fails:" in problems[3]
    assert problems[4] is not None and "NOT_EXPORTED: unbound variable" in problems[4]
    assert problems[5] is not None and "after" not in outcomes[5].output


async def _inject_unexported(ctx: Ctx) -> None:
    """Negative control against the live stack: a runbook that names $LOCK_SERVER_URL."""
    ctx.books["control.md"] = _book(
        "## RunbookNegativeControl\n\n**Confirm.**\n```sh\ncurl -s --max-time 5 "
        '"$LOCK_SERVER_URL/health"\n```\n'
    )


async def _reported(ctx: Ctx) -> bool:
    """The static check, on the live stack's environment file, names the variable."""
    exported = set(read_env_file(ctx.stack.env_file))
    problems = unexported([ctx.books["control.md"]], exported)
    return any("$LOCK_SERVER_URL is not exported" in p for p in problems)


async def _nothing(ctx: Ctx) -> None:
    """Nothing to recover."""


@needs_prometheus
@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_every_runbook_section_runs_as_written_against_its_cause(
    stack_env: dict[str, str], stack_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in stack_env.items():
        monkeypatch.setenv(key, value)
    short = selected(short=True)
    rest = [s for s in SCENARIOS if s not in short]
    control = Scenario(
        "negative control: a runbook names an unexported variable",
        ("RunbookNegativeControl",), _inject_unexported, _reported, _nothing,
    )  # fmt: skip
    options = GamedayOptions(run_dir=stack_dir, alerts=False, resolve_within_s=90.0)
    lines: list[str] = []
    rows = await run_gameday(options, lines.append, [*rest, control])
    *real, negative = rows
    assert [r.alert for r in real] == [a for s in rest for a in s.alerts]
    for row in real:
        assert row.ok, (row.alert, row.problems, lines[-40:])
        assert row.blocks_run >= 1
    # Every alert's section ran here or in the short game day.
    covered = {r.alert for r in real} | {a for s in short for a in s.alerts}
    assert covered == set(alerts())
    assert not negative.ok and negative.confirmed  # the static check reported it, and
    assert any("LOCK_SERVER_URL: unbound variable" in p for p in negative.problems), negative
