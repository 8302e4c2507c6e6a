"""The runbooks' command blocks, read from docs/runbooks/*.md and executed as written (NFR-11).

Owns: parsing each runbook into its sections (one per alert) and their ```` ```sh ```` blocks
with the phase each belongs to (**Confirm.**, **Do.**, **Verify recovery.**) and its markers
(`fails: REASON`, `timeout=N`; docs/runbooks/README.md), the static check that a block names
only variables the stack's environment file exports, and running a block verbatim in bash after
the file's first block (the `.` of the environment file) with nothing else in its environment
but PATH, HOME, LANG and PAYOUTS_ENV_FILE. Must never: edit a block, substitute a value into it,
or pass a block that exited non-zero (unless marked `fails:`), printed nothing, or outlived its
timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
DEFAULT_TIMEOUT_S = 30.0
#: The bold paragraph labels that start a phase of a section.
PHASES = {"Confirm.": "confirm", "Do.": "do", "Verify recovery.": "verify"}

_FENCE = re.compile(r"^```(\S*)\s*(.*)$")
_HEADING = re.compile(r"^## (.+?)\s*$")
_PHASE = re.compile(r"^\*\*(Confirm\.|Do\.|Verify recovery\.)\*\*")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|([A-Za-z_][A-Za-z0-9_]*))")
_ASSIGNED = re.compile(
    r"(?:^|[\s;(|&])(?:for|read(?:\s+-\w+)*)\s+([A-Za-z_][A-Za-z0-9_ ]*?)(?:\s+in\b|;|$)"
    r"|(?:^|[\s;(])([A-Za-z_][A-Za-z0-9_]*)=",
    re.M,
)
#: Variables every shell has (and bash's own): never an export of `payouts up`.
_SHELL = {"PATH", "HOME", "LANG", "PWD", "PAYOUTS_ENV_FILE"}


class RunbookError(ValueError):
    """A runbook that does not follow the conventions of docs/runbooks/README.md."""


@dataclass(frozen=True)
class Block:
    """One ```` ```sh ```` block of a runbook."""

    file: Path
    line: int
    #: The section (its alert), or "" for the file's first block, before any section.
    section: str
    phase: str
    code: str
    #: `fails: REASON`: expected to exit non-zero while the cause holds, for this reason.
    expect_fail: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def where(self) -> str:
        return f"{self.file.name}:{self.line} ({self.section or 'setup'}, {self.phase})"


@dataclass(frozen=True)
class Runbook:
    path: Path
    setup: Block
    blocks: tuple[Block, ...]

    def section(self, alert: str, phase: str | None = None) -> list[Block]:
        return [b for b in self.blocks if b.section == alert and phase in (None, b.phase)]


def _markers(info: str, where: str) -> tuple[str | None, float]:
    timeout = DEFAULT_TIMEOUT_S
    if m := re.match(r"timeout=(\d+)\s*", info):
        timeout = float(m.group(1))
        info = info[m.end() :]
    if not info:
        return None, timeout
    if m := re.fullmatch(r"fails:\s*(\S.*)", info):
        return m.group(1).strip(), timeout
    raise RunbookError(f"{where}: unknown marker {info!r} (docs/runbooks/README.md)")


def parse(path: Path, text: str | None = None) -> Runbook:
    """The runbook's blocks; its first block (before any section) is the setup of every block."""
    lines = (path.read_text() if text is None else text).splitlines()
    section, phase = "", "setup"
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _HEADING.match(line):
            section, phase = m.group(1), "section"
        elif m := _PHASE.match(line):
            phase = PHASES[m.group(1)]
        elif m := _FENCE.match(line):
            start, lang, info = i, m.group(1), m.group(2)
            i += 1
            body: list[str] = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if lang == "sh":
                where = f"{path.name}:{start + 1}"
                expect_fail, timeout = _markers(info, where)
                if section and phase not in PHASES.values():
                    raise RunbookError(f"{where}: a block outside Confirm./Do./Verify recovery.")
                code = "\n".join(body)
                blocks.append(Block(path, start + 1, section, phase, code, expect_fail, timeout))
        i += 1
    if not blocks or blocks[0].section:
        raise RunbookError(f"{path.name}: its first block must source the environment file")
    return Runbook(path, blocks[0], tuple(blocks[1:]))


def runbooks(folder: Path = RUNBOOKS) -> dict[str, Runbook]:
    """Every alert runbook, by file name: each file with ```` ```sh ```` blocks but README.md
    (whose block is the one every runbook starts with). A page with no such block (e.g.
    temporal-ui.md, which no alert links to) has nothing this module runs."""
    out = {}
    for path in sorted(folder.glob("*.md")):
        if path.name != "README.md" and re.search(r"^```sh\b", path.read_text(), re.M):
            out[path.name] = parse(path)
    return out


def section_of(alert: str, books: Mapping[str, Runbook]) -> tuple[Runbook, list[Block]]:
    for book in books.values():
        if blocks := book.section(alert):
            return book, blocks
    raise RunbookError(f"no runbook section with a command block for {alert}")


def names_used(code: str) -> set[str]:
    """Variables a block reads that it does not set itself (`X=`, `for X in`, `read X`); a
    `${X:-default}` counts as read too: under `set -u` only a default keeps it from failing, and
    a runbook should not need one (the setup's PAYOUTS_ENV_FILE is the exception)."""
    used = {a or b for a, b in _VAR.findall(code)}
    assigned: set[str] = set()
    for loop, plain in _ASSIGNED.findall(code):
        assigned |= set(loop.split()) if loop else {plain}
    return used - assigned


def unexported(books: Iterable[Runbook], exported: set[str]) -> list[str]:
    """Every block that names a variable the environment file does not export."""
    problems = []
    for book in books:
        for block in book.blocks:
            for name in sorted(names_used(block.code) - exported - _SHELL):
                problems.append(f"{block.where}: ${name} is not exported by `payouts up`")
    return problems


@dataclass(frozen=True)
class Outcome:
    block: Block
    rc: int | None  # None: killed at its timeout
    output: str

    @property
    def problem(self) -> str | None:
        b = self.block
        tail = self.output.strip()[-300:]
        if self.rc is None:
            return f"{b.where}: hung past its {b.timeout_s:.0f}s timeout: {tail}"
        if not self.output.strip():
            return f"{b.where}: printed nothing (exit {self.rc})"
        if b.expect_fail is not None and self.rc == 0:
            return f"{b.where}: marked `fails: {b.expect_fail}` but exited 0: {tail}"
        if b.expect_fail is None and self.rc != 0:
            return f"{b.where}: exited {self.rc}: {tail}"
        return None


def block_env(env_file: Path, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """A block's whole environment before its setup runs: PATH (this interpreter's bin first,
    where `payouts`, `python`, `temporal` and `etcdctl` are), HOME, LANG, PAYOUTS_ENV_FILE."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "PAYOUTS_ENV_FILE": str(env_file),
    }
    return {**env, **(overrides or {})}


async def run_block(
    book: Runbook, block: Block, env: Mapping[str, str], *, cwd: Path | None = None
) -> Outcome:
    """Run the block verbatim after the file's setup block; kill its process group at timeout.

    `env` is `block_env(...)`. A `PAYOUTS_RUNBOOK_<NAME>` in it re-exports NAME after the setup
    (a scenario's own world, e.g. the scratch reconciliation database): the block is untouched."""
    script = "set -u -o pipefail\n" + book.setup.code + "\nset -e\n" + _reexports(env) + block.code
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        env=dict(env),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own group: a timeout kills every command of the block
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), block.timeout_s)
        return Outcome(block, proc.returncode, out.decode(errors="replace"))
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
        return Outcome(block, None, out.decode(errors="replace"))


#: Variables a scenario points at another world after the environment file was sourced (the
#: game day's scratch reconciliation database): `PAYOUTS_RUNBOOK_<NAME>` re-exports NAME.
OVERRIDE_PREFIX = "PAYOUTS_RUNBOOK_"


def _reexports(env: Mapping[str, str]) -> str:
    lines = [
        f'export {k.removeprefix(OVERRIDE_PREFIX)}="${k}"\n'
        for k in env
        if k.startswith(OVERRIDE_PREFIX)
    ]
    return "".join(lines)
