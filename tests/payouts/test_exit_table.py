"""One exit-code table (payouts.errors.EXIT_TABLE), the README's, and every command keeps it.

Each command runs through the real console script (`.venv/bin/payouts`, `.venv/bin/payouts-lab`) against the real
servers of the session (PostgreSQL, the Temporal dev server, a lock server) or an address nothing
listens on, and its exit code is looked up by name in the table, so the README, the code and the
commands cannot drift apart.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment

from lab.cli import build_parser as build_lab_parser
from payouts.cli import build_parser
from payouts.errors import EXIT, EXIT_TABLE, exit_table_markdown
from stack.embedded.shared import free_port
from tests.credentials import OPERATOR, token_file
from tests.payouts.test_cli_commands import lock_url

__all__ = ["lock_url"]  # the module's real lock server, for the assertions and `lock revoke`

PAYOUTS = str(Path(sys.executable).with_name("payouts"))
README = Path(__file__).resolve().parents[2] / "README.md"
#: Variables that would point a command at some other stack than the one a test names.
_STACK_VARS = re.compile(r"(DATABASE_URL|TEMPORAL_|LOCK_URL|PAYOUTS_|WORKER_TASK_QUEUE|PG)")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus every stack variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not _STACK_VARS.match(k)}
    env["PAYOUTS_ENV_FILE"] = "/nonexistent/stack.env"  # never a running stack's file
    return {**env, **extra}


def payouts(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_script(PAYOUTS, *argv, env=env)


def run_script(
    script: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script, *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env=env or clean_env(),
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command's stderr, which must be exactly one line and no traceback."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_the_readme_table_is_the_code_table() -> None:
    """The README's table between its markers is EXIT_TABLE rendered: same codes, names, text;
    and every code and name is defined once."""
    text = README.read_text()
    table = text.split("<!-- exit-codes: begin -->\n")[1].split("\n<!-- exit-codes: end -->")[0]
    assert table == exit_table_markdown()
    rows = re.findall(r"^\| `(\d+)` \| (\w+) \|", table, flags=re.M)
    assert [(int(c), n) for c, n in rows] == [(e.code, e.name) for e in EXIT_TABLE]
    assert len({e.code for e in EXIT_TABLE}) == len(EXIT_TABLE) == len(EXIT)


def leaf_commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every runnable command of the parser, as its words (`("payout", "create")`, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words
        return
    for name, child in subs[0].choices.items():
        yield from leaf_commands(child, (*words, name))


#: Each console script with its parser, the commands it must have, and how many at least: the
#: operator's `payouts` and the lab's `payouts-lab` (which no longer lives inside `payouts`).
ENTRIES: dict[str, tuple[Callable[[], argparse.ArgumentParser], set[tuple[str, ...]], int]] = {
    "payouts": (build_parser, {("payout", "status"), ("lock", "revoke")}, 20),
    "payouts-lab": (build_lab_parser, {("chaos",), ("experiment", "pause"), ("demo",)}, 6),
}


@pytest.mark.timeout(1200)  # ~40 interpreter starts: minutes on a loaded 2-core machine
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_command_answers_an_argument_error_in_one_line_with_a_hint(entry: str) -> None:
    """Each of the entry's commands, given an option it does not have, exits `usage` with one
    line naming its own --help (not the whole usage), before doing anything."""
    make_parser, expected, at_least = ENTRIES[entry]
    commands = list(leaf_commands(make_parser()))
    assert expected <= set(commands)
    assert len(commands) >= at_least
    script = str(Path(sys.executable).with_name(entry))
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda w: (w, run_script(script, *w, "--no-such-option")), commands))
    for words, done in runs:
        line = one_line(done)
        assert done.returncode == EXIT["usage"], (words, done.stderr)
        assert line.startswith("usage error: "), line
        assert line.endswith(f"see `{entry} {' '.join(words)} --help`"), line


@pytest.mark.parametrize(
    "argv",
    [
        ("payout", "status", ""),
        ("payout", "show", "  "),
        ("payout", "abandon", "", "--reason", "x"),
        ("payout", "revoke", " ", "--reason", "x"),
        ("payout", "trace", ""),
        ("audit", "--payout", ""),
    ],
)
def test_a_blank_payout_id_is_a_usage_error(argv: tuple[str, ...]) -> None:
    done = payouts(*argv)
    assert done.returncode == EXIT["usage"]
    assert "the payout id must not be blank" in one_line(done)


@pytest.mark.parametrize(
    "argv",
    [
        ("seed",),
        ("payout", "create", "--account", "a", "--amount", "5", "--temporal", "127.0.0.1:1"),
        ("payout", "start-pending", "--temporal", "127.0.0.1:1"),
        ("payout", "show", "p1", "--temporal", "127.0.0.1:1"),
        ("audit",),
        ("db", "migrate"),
        ("outbox", "list"),
    ],
)
def test_a_missing_database_url_is_a_usage_error(argv: tuple[str, ...]) -> None:
    """No DSN anywhere: one line naming the variables, exit `usage`, before any server is
    reached (the Temporal address given is one nothing listens on)."""
    done = payouts(*argv)
    assert done.returncode == EXIT["usage"], done.stderr
    assert "DATABASE_URL is not set" in one_line(done)


async def _count(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM paydb.payouts"))
    finally:
        await conn.close()


def test_an_amount_out_of_range_is_a_usage_error_and_writes_nothing(db: str) -> None:
    """Above the database's bigint: refused by name before anything is written."""
    prefix = f"o{uuid.uuid4().hex[:5]}-"
    assert (
        payouts("seed", "--database-url", db, "--prefix", prefix, "--accounts", "1").returncode == 0
    )
    before = asyncio.run(_count(db))
    for amount in (str(2**63), "99999999999999999999"):
        argv = ["payout", "create", "--database-url", db, "--no-start"]
        done = payouts(*argv, "--account", f"{prefix}00000", "--amount", amount)
        assert done.returncode == EXIT["usage"], done.stderr
        assert "exceeds the largest, 9223372036854775807 minor units" in one_line(done)
    done = payouts(
        "payout",
        "create",
        "--database-url",
        db,
        "--no-start",
        "--generate",
        "1",
        "--accounts",
        "1",
        "--min-amount",
        str(2**63),
        "--max-amount",
        str(2**63),
    )
    assert done.returncode == EXIT["usage"], done.stderr
    assert asyncio.run(_count(db)) == before
    # The control: the largest amount itself is accepted and written.
    done = payouts(
        "payout",
        "create",
        "--database-url",
        db,
        "--no-start",
        "--account",
        f"{prefix}00000",
        "--amount",
        str(2**63 - 1),
    )
    assert done.returncode == EXIT["ok"], done.stderr
    assert asyncio.run(_count(db)) == before + 1


def test_unreachable_servers_are_named_whole(db: str) -> None:
    """Temporal, the database and the lock server each unreachable: exit `unavailable`, one
    line naming the address (and for Temporal where it comes from), never cut short."""
    port = free_port()
    done = payouts("payout", "status", "p1", "--temporal", f"127.0.0.1:{port}")
    line = one_line(done)
    assert done.returncode == EXIT["unavailable"]
    assert f"Temporal at 127.0.0.1:{port} is unreachable" in line
    assert "$TEMPORAL_ADDRESS" in line and "Connection refused" in line and line.endswith("7233")
    env = clean_env(TEMPORAL_ADDRESS=f"127.0.0.1:{port}")  # the address from the variable
    done = payouts("payout", "status", "p1", env=env)
    assert done.returncode == EXIT["unavailable"] and f"127.0.0.1:{port}" in one_line(done)
    # `payout list` reads the payment database, never Temporal: its database unreachable.
    done = payouts("payout", "list", "--database-url", f"postgresql://x@127.0.0.1:{port}/x")
    assert done.returncode == EXIT["unavailable"], done.stderr
    done = payouts("seed", "--database-url", f"postgresql://x@127.0.0.1:{port}/x")
    assert done.returncode == EXIT["unavailable"]
    assert "the database could not be used" in one_line(done)
    env = clean_env(PAYOUTS_OPERATOR_TOKEN_FILE=token_file(OPERATOR))
    argv = ["lock", "revoke", "--account", "a1", "--reason", "x"]
    done = payouts(*argv, "--lock-url", f"http://127.0.0.1:{port}", env=env)
    assert done.returncode == EXIT["unavailable"]
    assert f"lock server at http://127.0.0.1:{port} unreachable" in one_line(done)


def test_not_found_and_conflict(db: str, temporal_env: WorkflowEnvironment, lock_url: str) -> None:
    """An unknown payout is `not_found` for status, show, abandon, revoke and trace; a lock
    nobody holds is `not_found` for `lock revoke` (not "revoked"); a command to a payout whose
    workflow has ended is `conflict`."""
    address = temporal_env.client.service_client.config.target_host
    env = clean_env(
        TEMPORAL_ADDRESS=address,
        LOCK_URL=lock_url,
        PAYOUTS_OPERATOR_TOKEN_FILE=token_file(OPERATOR),
    )
    nope = f"nope-{uuid.uuid4().hex[:6]}"
    for argv in (
        ("payout", "status", nope),
        ("payout", "status", f"payout-{nope}"),
        ("payout", "show", nope, "--database-url", db),
        ("payout", "abandon", nope, "--reason", "x"),
        ("payout", "revoke", nope, "--reason", "x"),
    ):
        done = payouts(*argv, env=env)
        assert done.returncode == EXIT["not_found"], (argv, done.stderr)
        assert f"unknown payout {argv[2]}" in one_line(done)
    done = payouts("payout", "trace", nope, "--trace-dir", str(README.parent), env=env)
    assert done.returncode == EXIT["not_found"] and "no trace of payout" in one_line(done)
    account = f"idle-{uuid.uuid4().hex[:6]}"
    done = payouts("lock", "revoke", "--account", account, "--reason", "x", env=env)
    assert done.returncode == EXIT["not_found"], done.stderr
    assert f"lock payout:{account} has no holder: nothing was revoked" in one_line(done)
    assert "revoked payout" not in done.stdout

    prefix = f"k{uuid.uuid4().hex[:5]}-"
    assert (
        payouts("seed", "--database-url", db, "--prefix", prefix, "--accounts", "1").returncode == 0
    )
    create = ["payout", "create", "--database-url", db, "--task-queue", f"q-{uuid.uuid4()}"]
    create += ["--account", f"{prefix}00000", "--amount", "5", "--payout-id", f"{prefix}p"]
    assert payouts(*create, env=env).returncode == 0
    asyncio.run(_terminate(temporal_env, f"payout-{prefix}p"))
    done = payouts("payout", "abandon", f"payout-{prefix}p", "--reason", "x", env=env)
    assert done.returncode == EXIT["conflict"], done.stderr
    assert "has completed" in one_line(done)


async def _terminate(env: WorkflowEnvironment, workflow_id: str) -> None:
    await env.client.get_workflow_handle(workflow_id).terminate(reason="test: an ended workflow")


def test_a_reader_that_goes_away_ends_the_command_quietly(db: str) -> None:
    """`payouts audit` piped into a reader that stops after one line: exit `closed_output`,
    nothing on stderr (not "the database could not be used: BrokenPipeError"). The output is
    far larger than a pipe holds, so the write after the reader left must fail."""
    prefix = f"h{uuid.uuid4().hex[:5]}-"
    seeded = payouts("seed", "--database-url", db, "--prefix", prefix, "--accounts", "600")
    assert seeded.returncode == 0, seeded.stderr
    full = payouts("audit", "--database-url", db, "--limit", "1200")
    assert full.returncode == 0 and len(full.stdout) > 96 * 1024, len(full.stdout)  # pipe: 64 KiB
    proc = subprocess.Popen(
        [PAYOUTS, "audit", "--database-url", db, "--limit", "1200"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"#")
    proc.stdout.close()  # as `head -1` does
    assert proc.wait(timeout=120) == EXIT["closed_output"]
    assert proc.stderr.read() == b""
