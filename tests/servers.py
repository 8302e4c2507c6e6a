"""A real HTTP server for integration tests: uvicorn on a loopback port, in a thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from stack.embedded.shared import free_port


class ServerThread:
    """A uvicorn server on a loopback port (free unless given), in a thread with its own loop."""

    def __init__(self, app: Any, port: int | None = None, *, log_level: str = "warning") -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
