"""Every log line of a process is one JSON object with a stable event name, libraries included."""

from __future__ import annotations

import json
import subprocess
import sys

PROGRAM = """
import logging
from common.logs import configure_logging, get_logger
configure_logging("probe")
logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1:1/v1/sessions/s-1/keepalive")
logging.getLogger("httpx").warning("connection reset %s", "peer")
logging.getLogger("temporalio.workflow").info("grant %s lost", 7, extra={"payout_id": "p-1"})
get_logger("probe").info("lock.acquired", key="payout:a", token=7)
secret = "do-not-log-me"
try:
    raise RuntimeError("boom")
except RuntimeError:
    logging.getLogger("uvicorn.error").exception("request failed")
"""


def test_library_lines_are_structured_and_named() -> None:
    """stdlib lines (uvicorn, httpx, the workflow logger) come out as JSON with `log.<logger>`
    event names; httpx's per-request INFO chatter is dropped; tracebacks carry no locals."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, timeout=60
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [e["event"] for e in lines] == [
        "log.httpx",
        "log.temporalio.workflow",
        "lock.acquired",
        "log.uvicorn.error",
    ]
    assert all(e["component"] == "probe" and "ts" in e for e in lines)
    assert lines[1]["message"] == "grant 7 lost" and lines[1]["payout_id"] == "p-1"
    assert lines[3]["exception"][0]["exc_type"] == "RuntimeError"
    assert "do-not-log-me" not in done.stderr
    assert "keepalive" not in done.stderr


SERVICE_CRASH = """
import sys, warnings
from common.logs import configure_logging
configure_logging("probe", service=sys.argv[1] == "service")
warnings.warn("an old API", DeprecationWarning, stacklevel=1)
raise RuntimeError("boom")
"""


def test_a_services_warnings_and_crash_are_json_events() -> None:
    """Issue 28 §5: a service's whole log is JSON, its warnings and its dying traceback too;
    without `service` (a command whose user reads stderr) both stay Python's text."""
    args = [sys.executable, "-W", "always", "-c", SERVICE_CRASH]
    done = subprocess.run(
        [*args, "service"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [e["event"] for e in lines] == ["log.py.warnings", "process.crashed"]
    assert "an old API" in lines[0]["message"]
    assert lines[1]["exception"][0]["exc_type"] == "RuntimeError"
    assert lines[1]["level"] == "critical" and lines[1]["component"] == "probe"
    plain = subprocess.run(
        [*args, "command"], check=False, capture_output=True, text=True, timeout=60
    )
    assert plain.returncode == 1 and "Traceback (most recent call last)" in plain.stderr
