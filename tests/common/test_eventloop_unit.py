"""common.eventloop: which loop a worker or the publisher runs on, and its refusal of a value
it does not know. Real loops, no mock: each test runs a coroutine that reports its own loop."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from common import eventloop


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_the_default_is_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.LOOP_VAR, raising=False)
    assert eventloop.chosen() == "uvloop"
    assert issubclass(eventloop.run(_loop_type()), uvloop.Loop)


def test_asyncio_runs_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the test above: the same call, the other loop."""
    monkeypatch.setenv(eventloop.LOOP_VAR, " AsyncIO ")
    assert eventloop.chosen() == "asyncio"
    loop_type = eventloop.run(_loop_type())
    assert not issubclass(loop_type, uvloop.Loop)
    assert issubclass(loop_type, asyncio.BaseEventLoop)


def test_an_unknown_value_is_refused_and_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.LOOP_VAR, "tokio")
    ran = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(ValueError, match="PAYOUTS_EVENT_LOOP='tokio' is not one of"):
        eventloop.run(main())
    assert ran == []
    with pytest.raises(SystemExit) as exited:
        eventloop.check("worker")
    assert exited.value.code == 2
