"""Ending a process that used the Temporal SDK, with the exit code it meant.

Owns: `exit_now`. The Temporal SDK's Rust runtime keeps native threads that may still touch the
GIL while CPython finalizes; about one short-lived client process in five then dies with `Fatal
Python error: PyGILState_Release` (exit 134) or a segfault (139) *after* its work succeeded
(sdk-python issue 300). A script must be able to trust the exit code, so once a command or a
worker has finished and closed its own resources, it flushes what it wrote and leaves with
`os._exit`, skipping only the interpreter's teardown. Must never: be called while work is still
running (nothing after it runs: no `finally`, no atexit handler).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush logging and stdio, then `os._exit(code)`."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe cannot take more output; the exit code still counts.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def exit_code(exc: SystemExit) -> int:
    """The status `sys.exit(code)` would give: None is 0, a message is printed and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")
    return 1
