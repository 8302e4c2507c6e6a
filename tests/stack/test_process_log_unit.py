"""Issue 28 §5, unit: a child's log begins with a JSON start marker, which the JSON-lines check
accepts, and the check catches the old text marker and a service's stray text line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stack.process import STARTED_EVENT, ManagedProcess
from tests.jsonlogs import assert_every_line_json, non_json_lines


async def _never() -> bool:
    return False


def _run(log: Path, code: str) -> None:
    proc = ManagedProcess(
        name="probe",
        argv=[sys.executable, "-c", code],
        env={},
        log_path=log,
        health=_never,
        health_what="none",
    )
    proc.start()
    assert proc.proc is not None
    assert proc.proc.wait(timeout=60) == 0


def test_the_start_marker_is_a_json_event_naming_service_and_command(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    _run(log, 'print(\'{"event": "probe.ran"}\')')
    _run(log, 'print(\'{"event": "probe.ran"}\')')  # a restart appends its own marker
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in lines] == [STARTED_EVENT, "probe.ran", STARTED_EVENT, "probe.ran"]
    marker = lines[0]
    assert marker["service"] == "probe" and marker["component"] == "stack"
    assert marker["argv"][0] == sys.executable and marker["ts"].endswith("Z")
    assert_every_line_json({"probe": log})


def test_the_check_catches_a_text_line_and_the_old_marker(tmp_path: Path) -> None:
    """Negative controls: a service printing text, and the marker this issue replaced."""
    log = tmp_path / "probe.log"
    _run(log, "print('Temporal Server: localhost:7233')")
    assert non_json_lines([log]) == ["probe.log:2: Temporal Server: localhost:7233"]
    old = tmp_path / "old.log"
    old.write_text("--- 2026-12-02T17:10:00 start ['python', '-m', 'finledger']\n{}\n")
    assert len(non_json_lines([old])) == 1
    scalar = tmp_path / "scalar.log"
    scalar.write_text("42\n")  # JSON, but not an object: jq '.event' would fail on it
    assert non_json_lines([scalar]) == ["scalar.log:1: 42"]
