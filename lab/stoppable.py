"""Run a long command's coroutine so that SIGTERM and SIGHUP stop it as Ctrl-C does.

Owns: turning SIGTERM/SIGHUP (a CI runner's timeout, a container stop, a closed terminal) into a
cancellation of the main task, so that its `async with Stack(...)` stops every child it started
before the process exits; and the one message and exit status (`interrupted`) that every such
command gives once it has. Python's default SIGTERM handling ends the process at once and leaves
PostgreSQL, Temporal, the services and the workers running (a chaos run could leave a worker
SIGSTOPped forever). Must never: exit before the cancelled coroutine's cleanup has finished.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Signals that stop a long command in an orderly way (SIGINT is asyncio.run's own).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: A command's exit status once a stop signal or Ctrl-C has stopped it and every child it started.
INTERRUPTED = 130


def interrupted(detail: str = "") -> int:
    """Say on stderr that the command was stopped with every process it started (`detail`: e.g.
    where its logs are), and return its exit status, `INTERRUPTED`. Call it only once the
    stoppable coroutine's cleanup has finished."""
    sys.stderr.write(f"interrupted; every process was stopped{detail}\n")
    sys.stderr.flush()
    return INTERRUPTED


def run_stoppable(
    coro: Coroutine[Any, Any, T],
    runner: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run,
) -> T:
    """`runner(coro)` (`asyncio.run`, or `common.eventloop.run` for the workers' loop); SIGTERM
    or SIGHUP cancels it and raises `KeyboardInterrupt` once its cleanup is done. A second signal
    while stopping is ignored: the stop is already under way and interrupting it is what would
    leave children behind."""
    return runner(_guarded(coro))


async def _guarded(coro: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if not received:
            received.append(signum)
            main.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await coro
    except asyncio.CancelledError:
        if received:
            raise KeyboardInterrupt(signal.Signals(received[0]).name) from None
        raise
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
