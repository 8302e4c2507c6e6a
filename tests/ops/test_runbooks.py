"""Every runbook command is executed as written (issue 25, NFR-11; docs/runbooks/README.md).

Here, without a stack: every alert has a runbook section with command blocks, every block
follows the marker convention, every `curl` in the docs has a timeout, and the checker and the
runner catch each way a block can be wrong (negative controls: a runbook naming a variable
`payouts up` does not export; a block that prints nothing, one that hangs, one marked `fails:`
that succeeds). Live, against one etcd stack with each alert's cause injected: every section's
blocks run verbatim (tests/lab/test_gameday.py, after the short game day on the same stack), with
the same negative control against the live stack's environment file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.gameday.rules import alerts
from lab.gameday.runbooks import (
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

ROOT = RUNBOOKS.parent.parent
SETUP = '```sh\n. "${PAYOUTS_ENV_FILE:-.run/stack/stack.env}"\n```\n'


def control_book(text: str, name: str = "control.md") -> Runbook:
    """A runbook of `text`'s sections, after the real runbooks' first step."""
    return parse(Path(name), "# control\n\n" + SETUP + text)


def test_every_alert_has_a_runbook_section_with_commands() -> None:
    books = runbooks()
    for alert in alerts():
        book, blocks = section_of(alert, books)
        assert blocks, alert
        assert {b.phase for b in blocks} <= {"confirm", "do", "verify"}
        assert book.setup.code.strip().startswith(". "), book.path  # sources the env file


def test_markers_follow_the_convention() -> None:
    book = control_book(
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
        control_book("## A\n\n**Confirm.**\n```sh maybe\ntrue\n```\n")
    with pytest.raises(RunbookError, match="outside"):
        control_book("## A\n\n```sh\ntrue\n```\n")  # no phase: where would it run?


def test_the_static_check_reports_a_variable_payouts_up_does_not_export() -> None:
    """Negative control: the checker names the block and the variable; loop and read variables
    set by the block itself are not reported."""
    exported = {"LOCK_URL", "WORKER_URLS"}
    good = control_book(
        "## A\n\n**Confirm.**\n```sh\nfor url in $WORKER_URLS; do curl -s --max-time 5 "
        '"$url/health"; done\n```\n```sh\ncurl -s --max-time 5 "$LOCK_URL/health"\n```\n'
    )
    assert unexported([good], exported) == []
    bad = control_book(
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
    book = control_book(
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
