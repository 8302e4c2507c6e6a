"""Issue 28 §5: every line of every service log is one JSON object, from the first line on (the
stack's start marker included), so that `jq` reads a whole log: the logs of the processes the
stack starts itself (`<run dir>/logs/`), and the embedded PostgreSQL's and etcd's logs, JSON in
their own fields (tests/stack/test_embedded_servers.py; docs/local-stack.md)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from stack.system import Stack


def service_logs(stack: Stack) -> dict[str, Path]:
    """The log of every process the running stack started itself, by process name."""
    logs = stack.run_dir / "logs"
    return {n: info.log_path for n, info in stack.processes.items() if info.log_path.parent == logs}


def non_json_lines(paths: Iterable[Path]) -> list[str]:
    """`path:line: text` for each line that is not one JSON object (an empty file has none)."""
    bad: list[str] = []
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            try:
                ok = isinstance(json.loads(line), dict)
            except json.JSONDecodeError:
                ok = False
            if not ok:
                bad.append(f"{path.name}:{number}: {line[:200]}")
    return bad


def assert_every_line_json(logs: Mapping[str, Path]) -> None:
    """Every log begins with the stack's start marker and holds only JSON lines."""
    assert logs
    for name, path in logs.items():
        first = path.read_text(errors="replace").splitlines()[0]
        assert json.loads(first)["event"] == "stack.process.started", (name, first)
    bad = non_json_lines(logs.values())
    assert not bad, "\n".join(bad[:20])
