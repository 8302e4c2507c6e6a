"""Run a long command's coroutine so that SIGTERM and SIGHUP stop it as Ctrl-C does.

Owns: turning SIGTERM/SIGHUP (a CI runner's timeout, a container stop, a closed terminal) into a
cancellation of the main task, so that its `async with Stack(...)` stops every child it started
before the process exits. Python's default SIGTERM handling ends the process at once and leaves
PostgreSQL, Temporal, the services and the workers running (a chaos run could leave a worker
SIGSTOPped forever). Must never: exit before the cancelled coroutine's cleanup has finished.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Signals that stop a long command in an orderly way (SIGINT is asyncio.run's own).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


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
