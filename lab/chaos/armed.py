"""The chaos run's armed pause (UC-03 under load): a worker that SIGSTOPs itself just before its
first rail submission, thawed only once a newer holder's submission of the same payout was
recorded, so that its stale submission comes second, whatever the machine's speed.

Owns: the armed workers (each an extra worker, never a slot's, so the slot faults never touch
it), the thaw rule (`ArmedPauses.freeze`: after the newer submission, at the latest before the
frozen request's deadline) and each pause's record. Must never: leave an armed worker stopped or
running once its pause returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lab.chaos.attempts import ProxyAttempts
from lab.chaos.schedule import Fault
from lab.experiments.evidence import json_events, resumed_then_submitted
from lab.experiments.harness import process_state
from stack.process import ManagedProcess
from stack.system import Stack

__all__ = [
    "ARMED_ATTEMPT_WAIT_S",
    "ARMED_ENV",
    "ARMED_SEND_MARGIN_S",
    "ARMED_TRIGGER_WAIT_S",
    "ArmedPauses",
]

ARMED_ENV = {"WORKER_EXPERIMENT_PAUSE_BEFORE_SUBMIT": "true"}
#: How long an armed worker may take to reach its first submission before the fault gives up.
ARMED_TRIGGER_WAIT_S = 90.0
#: An armed worker is thawed at the latest this long before its frozen request's deadline, so the
#: thawed request still reaches the proxy's fence checks (the proxy refuses a request whose
#: deadline is too close before anything else).
ARMED_SEND_MARGIN_S = 5.0
#: After the thaw, how long the armed worker gets to make its stale attempt before it is stopped.
ARMED_ATTEMPT_WAIT_S = 30.0


class ArmedPauses:
    """The armed pauses of one run; each runs in the background with its own extra worker."""

    def __init__(
        self,
        stack: Stack,
        attempts: ProxyAttempts,
        *,
        worker_env: dict[str, str],
        progress: Callable[[str], None],
        workload_done: Callable[[], bool],
        submit_deadline_s: float,
    ) -> None:
        self.stack, self.attempts = stack, attempts
        self.worker_env = worker_env
        self.progress = progress
        self.workload_done = workload_done
        #: The payouts' submit deadline: the freeze's bound when the pausing event has none.
        self.submit_deadline_s = submit_deadline_s
        #: Armed pauses in progress: each runs in the background with its own extra worker, so
        #: its long freeze (until a newer holder submits) does not hold up the rest of the schedule.
        self.tasks: list[asyncio.Task[None]] = []
        #: Per armed pause (by fault index): set once its worker froze itself, or gave up.
        self.triggered: dict[int, asyncio.Event] = {}

    async def all_frozen(self, timeout_s: float) -> None:
        """Return once every armed pause fired so far has frozen its worker or given up, or
        after `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(e.wait() for e in self.triggered.values())), timeout_s
            )

    async def arm(self, fault: Fault) -> ManagedProcess:
        """Start an extra worker with the UC-03 hook armed (it SIGSTOPs itself just before its
        first rail submission). It is not a slot's worker, so the slot faults (pause, kill) never
        touch it. Separate from `fire` so fault #0 is armed before the workload starts."""
        return await self.stack.start_worker(None, {**self.worker_env, **ARMED_ENV})

    async def pause(self, fault: Fault, proc: ManagedProcess | None) -> dict[str, Any]:
        triggered = self.triggered.setdefault(fault.index, asyncio.Event())
        try:
            if proc is None:
                proc = await self.arm(fault)
        except BaseException:
            triggered.set()  # the worker never started: nothing will trigger
            raise
        try:
            return await self.freeze(proc, triggered)
        finally:
            triggered.set()  # whatever happened, nothing waits on this pause any longer
            # Its one stale attempt is made (or it never froze): the fleet is the slots again.
            with contextlib.suppress(Exception):
                self.stack.kill(proc.name, signal.SIGCONT)
                await self.stack.stop_worker(proc.name)

    async def freeze(self, proc: ManagedProcess, triggered: asyncio.Event) -> dict[str, Any]:
        pid = proc.pid or 0
        deadline = time.monotonic() + ARMED_TRIGGER_WAIT_S
        while process_state(pid) != "T":
            if time.monotonic() > deadline or self.workload_done() or not proc.running():
                return {"worker": proc.name, "armed": True, "triggered": False}
            await asyncio.sleep(0.05)
        triggered.set()
        frozen_at = time.monotonic()
        pausing = next(
            (e for e in json_events(proc.log_path) if e.get("event") == "experiment.pausing"), {}
        )
        token, payout_id = int(pausing.get("token", 0)), str(pausing.get("payout_id", ""))
        self.progress(
            f"  {proc.name} froze itself before submitting {payout_id} under token {token}; "
            "waiting for another worker to take over and submit it"
        )
        # Thaw only once the proxy has recorded a newer holder's submission of this payout (it
        # records every attempt before it forwards it, FR-19): the frozen holder's submission
        # then comes second, after the payout was submitted under a newer token, whatever the
        # machine's speed: the check-then-act gap the fencing tokens exist for. Bounded by the
        # frozen request's own deadline: thawed after it, the proxy would refuse the request as
        # DEADLINE_EXCEEDED before any fence check, and the fault would prove nothing.
        cap = self._thaw_cap(pausing, frozen_at)
        newer = False
        while not newer and time.monotonic() < cap and proc.running():
            await asyncio.sleep(0.25)
            newer = await self.attempts.newer_attempt(payout_id, token)
        stopped_s = round(time.monotonic() - frozen_at, 2)
        self.stack.kill(proc.name, signal.SIGCONT)
        attempted = await self._stale_attempt_made(proc)
        return {
            "worker": proc.name,
            "armed": True,
            "triggered": True,
            "payout_id": payout_id,
            "token": token,
            "taken_over": newer,
            "stopped_s": stopped_s,
            "stale_attempt": attempted,
        }

    def _thaw_cap(self, pausing: dict[str, Any], frozen_at: float) -> float:
        """The monotonic time by which the frozen holder must be thawed for its request to reach
        the proxy's fence checks: its deadline (in the `experiment.pausing` event), less a
        margin for the thawed process to send it; the freeze plus the run's submit deadline
        when the event has no deadline."""
        now = time.monotonic()
        left = self.submit_deadline_s - (now - frozen_at)
        with contextlib.suppress(KeyError, TypeError, ValueError):
            deadline = datetime.fromisoformat(str(pausing["deadline_at"]))
            left = (deadline - datetime.now(UTC)).total_seconds()
        return now + max(0.0, left - ARMED_SEND_MARGIN_S)

    async def _stale_attempt_made(self, proc: ManagedProcess) -> bool:
        """Wait (bounded) until the thawed worker's submission has had its answer: the proxy's
        refusal (fencing on) or the rail's reply (fencing off, the duplicate)."""
        deadline = time.monotonic() + ARMED_ATTEMPT_WAIT_S
        while time.monotonic() < deadline and proc.running():
            if resumed_then_submitted(json_events(proc.log_path)):
                return True
            await asyncio.sleep(0.25)
        return False
