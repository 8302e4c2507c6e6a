"""common.launcher.serve, the one launcher of the HTTP services: a real uvicorn in a process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx

from stack.embedded import free_port

PROGRAM = """
import sys
from fastapi import FastAPI
from common.launcher import serve
from common.logs import get_logger

def factory():
    get_logger("probe").info("probe.built")  # after logging is configured: an event too
    app = FastAPI()

    @app.get("/boom")
    async def boom():
        raise RuntimeError("boom")

    return app

serve(factory, service="probe", host="127.0.0.1", port=int(sys.argv[1]))
"""


def test_every_line_of_a_served_app_is_a_json_event() -> None:
    """An unhandled error in a route is logged by uvicorn as one JSON event (not its own
    plain-text traceback), the factory's own event comes out as JSON too, and no access line
    is written. SIGTERM stops the server (uvicorn shuts down, then re-raises the signal)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60  # a failure detector, not a timing assertion
        status = None
        while status is None:
            assert proc.poll() is None and time.monotonic() < deadline, "server never answered"
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/boom", timeout=5).status_code
            except httpx.TransportError:
                time.sleep(0.1)
        assert status == 500
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    events = [json.loads(line) for line in err.splitlines()]  # every line is one JSON object
    assert [e["event"] for e in events] == ["probe.built", "log.uvicorn.error"]
    assert all(e["component"] == "probe" for e in events)
    assert events[1]["level"] == "error"
    assert events[1]["exception"][0]["exc_type"] == "RuntimeError"
