"""lab.chaos.settle with MOCK state reads: a read that a fault cut short (PostgreSQL restarted
under it) is skipped, never the end of the run. A chaos run in CI once failed at its progress
line: a new connection met the server's FATAL before its query (asyncpg's InternalClientError)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from lab.chaos import settle
from lab.chaos.options import ChaosOptions


def _reads(*answers: list[str] | Exception) -> object:
    """A mock read answering (or raising) each of `answers` in turn, then the last forever."""
    queue = list(answers)

    async def read(database_url: str, prefix: str) -> list[str]:
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return read


async def test_unit_settle_skips_a_read_cut_short(monkeypatch: pytest.MonkeyPatch) -> None:
    cut = asyncpg.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    monkeypatch.setattr(settle, "_progress_states", _reads(cut, ConnectionResetError(), ["POSTED"]))
    opts = ChaosOptions(payouts=1, accounts=1, workers=1, seed=1, settle_timeout_s=30)
    assert await settle.settle("postgresql://unused", "acct-", opts, print) is True


async def test_unit_monitor_goes_on_after_a_read_cut_short(monkeypatch: pytest.MonkeyPatch) -> None:
    cut = asyncpg.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    monkeypatch.setattr(settle, "payout_states", _reads(cut, ["POSTED", "POSTED"]))
    lines: list[str] = []
    done = [False]
    monitor = asyncio.create_task(settle.monitor_progress("u", "acct-", 2, done, lines.append))
    try:
        async with asyncio.timeout(60):
            while not done[0]:
                assert not monitor.done(), monitor  # a cut read ended the monitor
                await asyncio.sleep(0.1)
    finally:
        monitor.cancel()
    assert lines == ["progress: 2/2 terminal, 0 ambiguous"]
