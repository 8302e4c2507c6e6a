"""Waiting for a condition in an integration test: a bound on how long we wait for it, never a
timing assertion (the one polling loop of the suite)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float = 30.0, every_s: float = 0.02
) -> None:
    """Poll `predicate` every `every_s` until it is true; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(every_s)
