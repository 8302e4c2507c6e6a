"""The chaos run's faults on the rail stub: behaviour windows (outage, ambiguity, slow lookups),
latency beyond the submit deadline (rail_slow), the rail's clock skewed, and a SIGKILL of the
stub followed by a restart on its own files.

Owns: the stub's baseline behaviour outside fault windows (RAIL_BASELINE, RAIL_CLOCK_BASELINE),
each window's mechanics and record, and the time by which the rail has answered every submission
a rail_slow window slowed (`answered_by`). Must never: leave the rail in a fault mode once a
window returned.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx

from lab.chaos.armed import ARMED_TRIGGER_WAIT_S, ArmedPauses
from lab.chaos.attempts import ProxyAttempts
from lab.chaos.schedule import Fault
from stack.system import Stack

__all__ = ["RAIL_BASELINE", "RAIL_CLOCK_BASELINE", "RAIL_SLOW_MAX_OPEN_S", "RailFaults"]

#: The rail stub's behaviour outside fault windows: modest fixed latency so runs stay short, and
#: no random ambiguity (ambiguity comes only from scheduled windows, so a seed decides it).
RAIL_BASELINE: dict[str, Any] = {
    "latency_mode": "fixed",
    "latency_fixed_ms": 30,
    "ambiguity_rate": 0.0,
    "outage": False,
    "visibility_delay_s": 0.0,
}
#: The rail clock's offset outside clock_skew windows. Sent apart from RAIL_BASELINE: a stub
#: without the knob ignores it (its patch model drops unknown fields), and that must not fail
#: the restore of the other fields.
RAIL_CLOCK_BASELINE: dict[str, Any] = {"clock_skew_s": 0.0}
#: A rail_slow window stays open past its seeded duration until at least one submission reached
#: the proxy in it (a small run may have none in a few seconds), but no longer than this.
RAIL_SLOW_MAX_OPEN_S = 30.0


class RailFaults:
    """Fires the rail faults on `stack`'s stub, steering it as the stack's operator (`http`)."""

    def __init__(
        self,
        stack: Stack,
        http: httpx.AsyncClient,
        attempts: ProxyAttempts,
        armed: ArmedPauses,
        *,
        submit_deadline_s: float,
        workload_done: Callable[[], bool],
    ) -> None:
        self.stack, self.http = stack, http
        self.attempts, self.armed = attempts, armed
        #: The payouts' submit deadline: a rail_slow window's latency exceeds it.
        self.submit_deadline_s = submit_deadline_s
        self.workload_done = workload_done
        #: Monotonic time by which the rail has answered every submission a rail_slow window
        #: slowed: the evidence is only complete after it (the runner waits for it).
        self.answered_by = 0.0

    async def rail(self, patch: dict[str, Any]) -> None:
        r = await self.http.post(f"{self.stack.railstub_url}/admin/behaviour", json=patch)
        r.raise_for_status()

    async def window(self, fault: Fault) -> dict[str, Any]:
        windows: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
            "rail_outage": ({"outage": True}, {"outage": False}),
            "rail_ambiguity": ({"ambiguity_rate": fault.level}, {"ambiguity_rate": 0.0}),
            "slow_lookups": ({"visibility_delay_s": fault.level}, {"visibility_delay_s": 0.0}),
        }
        on, off = windows[fault.kind]
        await self.rail(on)
        try:
            await asyncio.sleep(fault.duration_s)
        finally:
            await self.rail(off)
        return {"window_s": fault.duration_s, **on}

    async def slow(self, fault: Fault) -> dict[str, Any]:
        """Every submission received in the window takes longer than the submit deadline: the
        proxy's forward times out (RAIL_AMBIGUOUS) and the workflow's lookups run while the rail
        is still working on the movement. Only "absent" on sound evidence keeps these payouts
        from ending FAILED while their money moves (INV-09 checks it)."""
        latency_ms = int((self.submit_deadline_s + fault.level) * 1000)
        on = {"latency_mode": "fixed", "latency_fixed_ms": latency_ms}
        # Not before every armed pause has frozen its worker: slowed payouts hold their
        # accounts for the deadline, and the armed worker might then find no submission to
        # freeze before (the gap the fencing-off negative control relies on).
        waited = time.monotonic()
        await self.armed.all_frozen(ARMED_TRIGGER_WAIT_S)
        waited_s = round(time.monotonic() - waited, 2)
        before = await self.attempts.last_attempt_id()
        opened = time.monotonic()
        await self.rail(on)
        try:
            await asyncio.sleep(fault.duration_s)
            slowed = await self.attempts.attempts_since(before)
            while (
                not slowed
                and time.monotonic() - opened < RAIL_SLOW_MAX_OPEN_S
                and not self.workload_done()
            ):
                await asyncio.sleep(0.25)
                slowed = await self.attempts.attempts_since(before)
        finally:
            await self.rail({"latency_fixed_ms": RAIL_BASELINE["latency_fixed_ms"]})
            self.answered_by = max(self.answered_by, time.monotonic() + latency_ms / 1000 + 1.0)
        return {
            "window_s": round(time.monotonic() - opened, 2),
            "submit_deadline_s": self.submit_deadline_s,
            "slowed_attempts": await self.attempts.attempts_since(before),
            "waited_for_armed_s": waited_s,
            **on,
        }

    async def clock_skew(self, fault: Fault) -> dict[str, Any]:
        """The rail's clock runs `level` seconds off ours for the window (the stub's
        `clock_skew_s` knob). A stub without the knob drops the field: the record says the
        fault was not applied and the run goes on."""
        applied = await self.set_clock_skew(fault.level)
        if not applied:
            return {"clock_skew_s": fault.level, "applied": False}
        try:
            await asyncio.sleep(fault.duration_s)
        finally:
            await self.set_clock_skew(0.0)
        return {"window_s": fault.duration_s, "clock_skew_s": fault.level, "applied": True}

    async def set_clock_skew(self, skew_s: float) -> bool:
        """True when the stub took the offset (it echoes its whole behaviour back)."""
        r = await self.http.post(
            f"{self.stack.railstub_url}/admin/behaviour", json={"clock_skew_s": skew_s}
        )
        if r.status_code == 422:
            return False
        r.raise_for_status()
        return bool(r.json().get("clock_skew_s") == skew_s)

    async def restart(self, fault: Fault) -> dict[str, Any]:
        """SIGKILL the rail stub and start it again with the same environment (its movement log
        file, RAILSTUB_MOVEMENTS_PATH, when the stack sets one). A real rail keeps its records
        through a crash: the counts before and after show whether this one did."""
        before = await self._movement_count()
        self.stack.kill("railstub", signal.SIGKILL)
        await self.stack.restart("railstub")
        after = await self._movement_count()
        # The behaviour set over the admin API lived in the old process: the baseline again.
        await self.rail(RAIL_BASELINE)
        return {"movements_before": before, "movements_after": after}

    async def _movement_count(self) -> int | None:
        try:
            r = await self.http.get(f"{self.stack.railstub_url}/admin/movements", timeout=30)
            r.raise_for_status()
            return len(r.json()["movements"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None
