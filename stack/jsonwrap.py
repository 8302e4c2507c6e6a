"""Run a third-party command whose output is plain text, and write each line as one JSON event.

Owns: turning a child's text lines (HAProxy's notices, warnings and alerts: a replica going
DOWN or UP) into the events every stack log holds (issue 28 §5: `jq` reads a whole log), shaped
as common.logs' are (`event`, `component`, `level`, `ts`). Must never: change, drop or delay a
line, or outlive its child.

Usage: `python -m stack.jsonwrap COMPONENT -- ARGV...`. Its exit code is the child's. Both run
in the stack's process group, so a signal to the group (stop, SIGKILL, SIGSTOP) reaches both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

_LEVELS = {"[ALERT]": "error", "[WARNING]": "warning", "[NOTICE]": "info"}


def event(component: str, line: str) -> str:
    """One text line as a JSON event: the level from HAProxy's own tag, else info."""
    level = next((lv for tag, lv in _LEVELS.items() if line.startswith(tag)), "info")
    return json.dumps(
        {
            "component": component,
            "event": f"{component}.output",
            "level": level,
            "message": line,
            "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        },
        sort_keys=True,
    )


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        _write(json.dumps({"event": "jsonwrap.usage", "level": "error", "argv": list(argv)}))
        return 2
    component, command = argv[0], list(argv[2:])
    child = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert child.stdout is not None
    for raw in child.stdout:
        text = raw.decode(errors="replace").rstrip("\r\n")
        if text:
            _write(event(component, text))
    return child.wait()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
