"""Ending a process with the exit code it meant: a refusal to start, or a process that used the
Temporal SDK.

Owns: `exit_now`, `refuse` (a process that must not start says why in one line on stderr
and exits 2, before it has started anything: the safe default of every entry point), and
`load_settings` (a settings value that does not parse, e.g. `LOCK_PORT=abc`, is such a refusal,
naming the variable, instead of a traceback).

The Temporal SDK's Rust runtime keeps native threads that may still touch the GIL while CPython
finalizes; about one short-lived client process in five then dies with `Fatal Python error:
PyGILState_Release` (exit 134) or a segfault (139) *after* its work succeeded (sdk-python issue
300). A script must be able to trust the exit code, so once a command or a worker has finished
and closed its own resources, it flushes what it wrote and leaves with `os._exit`, skipping only
the interpreter's teardown. Must never: call `exit_now` while work is still running (nothing
after it runs: no `finally`, no atexit handler).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def exit_now(code: int) -> NoReturn:
    """Export the spans still queued (common.tracing), flush logging and stdio, then
    `os._exit(code)`."""
    from common import tracing

    tracing.shutdown()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe cannot take more output; the exit code still counts.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def refuse(process: str, why: str) -> NoReturn:
    """`<process>: <why>` as one line on stderr, then exit 2: a refusal to start, printed before
    logging is configured and before anything (a port, a pool, a migration) has started."""
    sys.stderr.write(f"{process}: {why}\n")
    raise SystemExit(2)


def load_settings(process: str, cls: type[S]) -> S:
    """`cls()` from the environment, or a refusal (exit 2) naming each variable that does not
    parse and why, with its value left out (it may be a secret's path or a URL with a password).
    """
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix") or "")
        problems = [
            f"{prefix}{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)
        ]
        refuse(process, "invalid settings: " + "; ".join(problems))


def exit_code(exc: SystemExit) -> int:
    """The status `sys.exit(code)` would give: None is 0, a message is printed and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")
    return 1
