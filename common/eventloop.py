"""The event loop of the project's long-running processes that are not uvicorn's: the payout
workers and the outbox publisher run on uvloop, as the HTTP services (uvicorn[standard]) and the
PostgreSQL TLS front (stack.pgtls) already do (issue 29).

Why: these processes spend their CPU on sockets, most of them TLS (to PostgreSQL's front, the
lock server and the rail proxy), and asyncio's own TLS transport is pure Python; uvloop's is
not. The A/B that justifies it is in docs/performance.md ("uvloop in the workers and the
publisher"). `PAYOUTS_EVENT_LOOP=asyncio` runs the standard loop instead: kept for that A/B and
as a way back should a library misbehave on uvloop; any other value is refused.

Owns: `run`, the one way such a process enters its event loop, and `check`, its refusal of
a value it does not know.
Must never: import anything of the project outside `common`, or choose a loop for a
short-lived CLI command (its cost is start-up, not sockets: those keep `asyncio.run`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

from common.exiting import refuse

#: `asyncio` for the standard loop; unset, empty or `uvloop` for uvloop.
LOOP_VAR = "PAYOUTS_EVENT_LOOP"
_CHOICES = ("uvloop", "asyncio")

T = TypeVar("T")


def chosen() -> str:
    """The loop $PAYOUTS_EVENT_LOOP names (default `uvloop`); ValueError for any other value."""
    raw = os.environ.get(LOOP_VAR, "").strip().lower() or "uvloop"
    if raw not in _CHOICES:
        raise ValueError(f"{LOOP_VAR}={raw!r} is not one of {', '.join(_CHOICES)}")
    return raw


def check(process: str) -> None:
    """Refuse to start (`<process>: ...` on stderr, exit 2) when $PAYOUTS_EVENT_LOOP names no
    loop: called by an entry point first, before anything has started."""
    try:
        chosen()
    except ValueError as exc:
        refuse(process, str(exc))


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on the chosen loop, as `asyncio.run` does (a new loop, closed
    after, async generators and the default executor shut down)."""
    try:
        loop = chosen()
    except ValueError:
        main.close()  # never awaited: no "coroutine was never awaited" warning on the refusal
        raise
    if loop == "asyncio":
        return asyncio.run(main)
    return uvloop.run(main)
