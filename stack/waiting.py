"""Waiting on the stack's servers: a blocking start or stop run in a thread that a cancellation
cannot cut short, and a check polled until it passes or its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from stack.config import StackError

__all__ = ["in_thread", "wait_until"]

T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    """Run blocking `fn` in a thread; on cancellation, let it finish before re-raising.

    Otherwise a Ctrl-C during `pg_ctl start` would run the shutdown while the start is still
    going, and the server would come up after the stack had already stopped it.
    """
    fut = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


async def wait_until(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise StackError(f"{what} was not reachable within {within_s:.0f}s")
        await asyncio.sleep(0.1)
