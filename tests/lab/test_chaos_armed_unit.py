"""Unit tests of the armed pause's thaw rule (lab.chaos.armed), with a MOCKED stack, process and
proxy record: the frozen holder is thawed only once the proxy has recorded a newer holder's
submission of its payout, however long that takes (here: many polls), and at the latest before
its frozen request's deadline. The real processes are the chaos runs (test_chaos_runs.py)."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from lab.chaos import armed as chaos_armed
from lab.chaos.armed import ARMED_SEND_MARGIN_S, ArmedPauses
from lab.chaos.faults import FaultInjector
from stack.process import ManagedProcess
from stack.system import Stack


class _Stack:
    def __init__(self) -> None:
        self.signals: list[tuple[str, int]] = []

    def operator_headers(self) -> dict[str, str]:
        return {}

    def kill(self, name: str, sig: int) -> None:
        self.signals.append((name, sig))


def _armed(
    monkeypatch: pytest.MonkeyPatch, deadline_in_s: float, newer_after_polls: int | None
) -> tuple[ArmedPauses, _Stack, list[int]]:
    stack = _Stack()
    inj = FaultInjector(cast(Stack, stack), worker_env={}, lease_s=10.0, progress=lambda _s: None)
    pauses = inj.armed
    deadline = datetime.now(UTC) + timedelta(seconds=deadline_in_s)
    pausing = {"event": "experiment.pausing", "token": 7, "payout_id": "po-1",
               "deadline_at": deadline.isoformat()}  # fmt: skip
    monkeypatch.setattr(chaos_armed, "process_state", lambda _pid: "T")
    monkeypatch.setattr(chaos_armed, "json_events", lambda _path: [pausing])
    polls: list[int] = []

    async def newer_attempt(payout_id: str, token: int) -> bool:
        assert (payout_id, token) == ("po-1", 7)
        polls.append(len(stack.signals))  # how many signals were sent before this poll
        return newer_after_polls is not None and len(polls) >= newer_after_polls

    async def stale_attempt_made(_proc: Any) -> bool:
        return True

    async def no_sleep(_s: float) -> None:
        return None

    monkeypatch.setattr(pauses.attempts, "newer_attempt", newer_attempt)
    monkeypatch.setattr(pauses, "_stale_attempt_made", stale_attempt_made)
    monkeypatch.setattr(asyncio, "sleep", no_sleep)
    return pauses, stack, polls


def _proc() -> ManagedProcess:
    proc = SimpleNamespace(
        name="worker-armed", pid=4242, log_path=Path("/nonexistent"), running=lambda: True
    )
    return cast(ManagedProcess, proc)


async def test_the_frozen_holder_is_thawed_only_after_a_newer_submission_was_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 polls find nothing (a slow takeover on a loaded machine): no SIGCONT meanwhile; the
    first poll that finds the newer attempt is followed by the thaw."""
    inj, stack, polls = _armed(monkeypatch, deadline_in_s=80.0, newer_after_polls=200)
    event = SimpleNamespace(set=lambda: None)
    record = await inj.freeze(_proc(), cast(Any, event))
    assert len(polls) == 200 and set(polls) == {0}  # nothing thawed before the newer attempt
    assert stack.signals == [("worker-armed", signal.SIGCONT)]
    assert record["taken_over"] is True and record["stale_attempt"] is True


async def test_the_frozen_holder_is_thawed_before_its_requests_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With its deadline closer than the send margin, waiting on would only make the proxy
    refuse it as DEADLINE_EXCEEDED: it is thawed at once, and the record says no takeover."""
    inj, stack, polls = _armed(monkeypatch, ARMED_SEND_MARGIN_S / 2, newer_after_polls=None)
    record = await inj.freeze(_proc(), cast(Any, SimpleNamespace(set=lambda: None)))
    assert polls == [] and stack.signals == [("worker-armed", signal.SIGCONT)]
    assert record["taken_over"] is False
