"""common.launcher.serve, the one launcher of the HTTP services: a real uvicorn in a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

from common.tracefile import read_spans
from stack.embedded.shared import free_port

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


TRACED = """
import sys
from fastapi import FastAPI
from common.launcher import serve
from common.logs import get_logger

def factory():
    app = FastAPI()

    @app.get("/work")
    async def work():
        get_logger("probe").info("probe.worked")
        return {}

    @app.get("/health")
    async def health():
        return {}

    return app

serve(factory, service="probe", host="127.0.0.1", port=int(sys.argv[1]))
"""


def test_a_served_app_continues_the_callers_trace_and_exports_it_at_sigterm(
    tmp_path: Path,
) -> None:
    """With a trace folder set, a request carrying `traceparent` gets a server span in the
    caller's trace, parented to the caller's span, and its events carry the trace id; a health
    probe gets no span; the spans are in the file after SIGTERM (flushed at the lifespan's end,
    before uvicorn re-raises the signal)."""
    port = free_port()
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = {**os.environ, "PAYOUTS_TRACE_DIR": str(tmp_path)}
    env.pop("OTEL_SDK_DISABLED", None)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", TRACED, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60  # a failure detector, not a timing assertion
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server never answered"
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).raise_for_status()
                break
            except httpx.TransportError:
                time.sleep(0.1)
        # urllib, not httpx: once any test in this process set up tracing (an in-process CLI
        # call does), httpx is instrumented and would replace this traceparent with its own.
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/work",
            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    spans = read_spans(tmp_path)
    assert [(s.name, s.kind, s.trace_id, s.parent_id) for s in spans] == [
        ("GET /work", "SERVER", trace_id, parent)
    ]
    worked = next(json.loads(line) for line in err.splitlines() if "probe.worked" in line)
    assert (worked["trace_id"], worked["span_id"]) == (trace_id, spans[0].span_id)
