"""The chaos runner's fault injector: applies scheduled faults to a running local stack.

Owns: the worker fleet of a chaos run (one worker per slot, replaced after a kill; an armed
pause runs its own extra worker, so it never takes a slot's worker away), every fault's mechanics
(SIGSTOP/SIGCONT, SIGKILL, service restarts, an etcd leader kill with its unavailability window
measured by lock acquires, rail stub behaviour windows) and
restoring normal behaviour at the end. Must never: touch a process the stack did not start, or
leave a worker stopped or the rail in a fault mode once `restore()` returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx

from payouts.chaos_schedule import Fault
from payouts.experiments import json_events, process_state, resumed_then_submitted
from payouts.logs import get_logger
from payouts.pgutil import create_pool
from payouts.stack import Stack
from payouts.stack_process import ManagedProcess

log = get_logger("payouts.chaos")

#: The rail stub's behaviour outside fault windows: modest fixed latency so runs stay short, and
#: no random ambiguity (ambiguity comes only from scheduled windows, so a seed decides it).
RAIL_BASELINE: dict[str, Any] = {
    "latency_mode": "fixed",
    "latency_fixed_ms": 30,
    "ambiguity_rate": 0.0,
    "outage": False,
    "visibility_delay_s": 0.0,
}
ARMED_ENV = {"WORKER_EXPERIMENT_PAUSE_BEFORE_SUBMIT": "true"}
#: How long an armed worker may take to reach its first submission before the fault gives up.
ARMED_TRIGGER_WAIT_S = 90.0
#: Upper bound on an armed worker's freeze. The takeover of the frozen worker's payout waits for
#: Temporal to time out its submit activity, which can take up to the holder steps' 60 s
#: start-to-close; the bound stays inside the run's submit deadline (payouts.chaos), so the thawed
#: request reaches the fence checks instead of expiring first.
ARMED_MAX_FREEZE_S = 75.0
#: After the thaw, how long the armed worker gets to make its stale attempt before it is stopped.
ARMED_ATTEMPT_WAIT_S = 30.0


class ChaosError(RuntimeError):
    """The chaos run could not inject a fault or finish (not: an invariant broke, a result)."""


class FaultInjector:
    """Fires faults against `stack`; `records` keeps what actually happened, per fault."""

    def __init__(
        self,
        stack: Stack,
        *,
        worker_env: dict[str, str],
        lease_s: float,
        progress: Callable[[str], None],
        workload_done: Callable[[], bool] = lambda: False,
    ) -> None:
        self.stack = stack
        self.worker_env = worker_env
        self.lease_s = lease_s
        self.progress = progress
        # One HTTP client and one small pool for the whole run: building an httpx client costs an
        # SSL context and a PostgreSQL connection costs a backend process, and the armed pauses
        # and leader-kill probes ask many times a second (they were a fifth of a core).
        self._http = httpx.AsyncClient(timeout=5.0)
        self._pool: asyncpg.Pool | None = None
        self.workload_done = workload_done
        self.slots: list[str] = []
        self.records: list[dict[str, Any]] = []
        #: Armed pauses in progress: each runs in the background with its own extra worker, so
        #: its long freeze (up to ARMED_MAX_FREEZE_S) does not hold up the rest of the schedule.
        self._armed: list[asyncio.Task[None]] = []
        self.leader_changes: list[dict[str, Any]] = []
        self._probe_seq = 0

    # ------------------------------------------------------------------ fleet

    async def start_fleet(self, workers: int) -> None:
        for _ in range(workers):
            proc = await self.stack.start_worker(None, self.worker_env)
            self.slots.append(proc.name)

    # ------------------------------------------------------------------ running a schedule

    async def run(self, faults: list[Fault], t0: float) -> None:
        """Fire each fault in order, no earlier than t0 + at_s (later if the previous one ran
        long), so the order and parameters are the seed's even when timing slips. Armed pauses
        go on in the background; this returns once they have all finished too."""
        try:
            for fault in faults:
                delay = t0 + fault.at_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self.fire(fault, t0)
            await asyncio.gather(*self._armed)
        finally:
            for task in self._armed:
                task.cancel()
            await asyncio.gather(*self._armed, return_exceptions=True)
            self.records.sort(key=lambda r: int(r["index"]))

    async def fire(self, fault: Fault, t0: float, armed: ManagedProcess | None = None) -> None:
        """Fire one fault; an armed pause is started here and finishes in the background."""
        if fault.kind == "pause" and fault.armed:
            self._armed.append(asyncio.create_task(self._fire(fault, t0, armed)))
            return
        await self._fire(fault, t0, None)

    async def _fire(self, fault: Fault, t0: float, armed: ManagedProcess | None) -> None:
        started = time.monotonic()
        self.progress(f"fault {fault.describe()} (fired at t+{started - t0:.1f}s)")
        record: dict[str, Any] = {
            "index": fault.index,
            "kind": fault.kind,
            "fired_at_s": round(started - t0, 2),
        }
        handler = {
            "pause": self._pause,
            "kill": self._kill,
            "lock_server_restart": self._lock_server_restart,
            "backend_restart": self._backend_restart,
            "rail_outage": self._rail_window,
            "rail_ambiguity": self._rail_window,
            "slow_lookups": self._rail_window,
        }[fault.kind]
        if fault.kind == "pause" and fault.armed:
            record.update(await self._armed_pause(fault, armed))
        else:
            record.update(await handler(fault))
        record["took_s"] = round(time.monotonic() - started, 2)
        log.info("chaos.fault_fired", **record)
        self.records.append(record)

    # ------------------------------------------------------------------ worker faults

    async def _pause(self, fault: Fault) -> dict[str, Any]:
        name = self.slots[fault.target]
        self.stack.kill(name, signal.SIGSTOP)
        try:
            await asyncio.sleep(fault.duration_s)
        finally:
            self.stack.kill(name, signal.SIGCONT)
        return {"worker": name, "stopped_s": fault.duration_s}

    async def arm(self, fault: Fault) -> ManagedProcess:
        """Start an extra worker with the UC-03 hook armed (it SIGSTOPs itself just before its
        first rail submission). It is not a slot's worker, so the slot faults (pause, kill) never
        touch it. Separate from `fire` so fault #0 is armed before the workload starts."""
        return await self.stack.start_worker(None, {**self.worker_env, **ARMED_ENV})

    async def _armed_pause(self, fault: Fault, proc: ManagedProcess | None) -> dict[str, Any]:
        if proc is None:
            proc = await self.arm(fault)
        try:
            return await self._armed_freeze(proc)
        finally:
            # Its one stale attempt is made (or it never froze): the fleet is the slots again.
            with contextlib.suppress(Exception):
                self.stack.kill(proc.name, signal.SIGCONT)
                await self.stack.stop_worker(proc.name)

    async def _armed_freeze(self, proc: ManagedProcess) -> dict[str, Any]:
        pid = proc.pid or 0
        deadline = time.monotonic() + ARMED_TRIGGER_WAIT_S
        while process_state(pid) != "T":
            if time.monotonic() > deadline or self.workload_done() or not proc.running():
                return {"worker": proc.name, "armed": True, "triggered": False}
            await asyncio.sleep(0.05)
        frozen_at = time.monotonic()
        pausing = next(
            (e for e in json_events(proc.log_path) if e.get("event") == "experiment.pausing"), {}
        )
        token, payout_id = int(pausing.get("token", 0)), str(pausing.get("payout_id", ""))
        self.progress(
            f"  {proc.name} froze itself before submitting {payout_id} under token {token}; "
            "waiting for its lease to expire and another worker to take over"
        )
        # Thaw only after the server expired the lease AND a newer holder got the payout past its
        # submission (or it is terminal): the stale holder then submits a payout that was already
        # submitted under a newer token, the check-then-act gap the fencing tokens exist for.
        taken_over = False
        while time.monotonic() - frozen_at < ARMED_MAX_FREEZE_S:
            if time.monotonic() - frozen_at > self.lease_s + 1.0:
                taken_over = await self._superseded(payout_id, token)
                if taken_over:
                    break
            await asyncio.sleep(1.0)
        stopped_s = round(time.monotonic() - frozen_at, 2)
        self.stack.kill(proc.name, signal.SIGCONT)
        attempted = await self._stale_attempt_made(proc)
        return {
            "worker": proc.name,
            "armed": True,
            "triggered": True,
            "payout_id": payout_id,
            "token": token,
            "taken_over": taken_over,
            "stopped_s": stopped_s,
            "stale_attempt": attempted,
        }

    async def _stale_attempt_made(self, proc: ManagedProcess) -> bool:
        """Wait (bounded) until the thawed worker's submission has had its answer: the proxy's
        refusal (fencing on) or the rail's reply (fencing off, the duplicate)."""
        deadline = time.monotonic() + ARMED_ATTEMPT_WAIT_S
        while time.monotonic() < deadline and proc.running():
            if resumed_then_submitted(json_events(proc.log_path)):
                return True
            await asyncio.sleep(0.25)
        return False

    async def _superseded(self, payout_id: str, token: int) -> bool:
        # Armed pauses run beside the other faults: PostgreSQL may be restarting right now.
        try:
            if self._pool is None:
                self._pool = await create_pool(
                    self.stack.database_url, min_size=0, max_size=2, timeout=5
                )
            row = await self._pool.fetchrow(
                "SELECT state, fence FROM paydb.payouts WHERE payout_id = $1", payout_id
            )
        except (
            TimeoutError,
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            # A restart can leave a pooled connection mid-protocol (as in railproxy.service).
            asyncpg.InternalClientError,
        ):
            return False
        if row is None:
            return False
        state = str(row["state"])
        if state in ("POSTED", "FAILED", "ABANDONED"):
            return True
        return int(row["fence"]) > token and state not in ("PENDING", "CLAIMED")

    async def _kill(self, fault: Fault) -> dict[str, Any]:
        name = self.slots[fault.target]
        self.stack.kill(name, signal.SIGKILL)
        await self.stack.stop_worker(name)  # reaps it; SIGKILL already ended it
        proc = await self.stack.start_worker(None, self.worker_env)
        self.slots[fault.target] = proc.name
        return {"worker": name, "replacement": proc.name}

    # ------------------------------------------------------------------ service faults

    async def _lock_server_restart(self, fault: Fault) -> dict[str, Any]:
        await self.stack.restart("lock-server")
        return {}

    async def _backend_restart(self, fault: Fault) -> dict[str, Any]:
        if self.stack.config.backend == "postgres":
            # The embedded PostgreSQL holds the lock tables AND the payment database.
            await self.stack.restart("postgres")
            return {"restarted": "postgres"}
        return await self._etcd_leader_kill()

    async def _etcd_leader_kill(self) -> dict[str, Any]:
        leader = await self._leader(within_s=10.0)
        if leader is None:
            return {"restarted": "etcd", "leader": None, "note": "no leader found"}
        if not await self._probe_acquire():
            self.progress("  warning: lock acquire failed before the leader kill")
        killed_at = time.monotonic()
        await self.stack.stop_etcd_member(leader, signal.SIGKILL)
        # The window: from the kill until a lock acquire succeeds again through the lock server
        # (a new leader elected, the lock server's channel failed over, a grant written).
        available = False
        while time.monotonic() - killed_at < 60.0:
            if await self._probe_acquire():
                available = True
                break
            await asyncio.sleep(0.05)
        window = round(time.monotonic() - killed_at, 3)
        new_leader = await self._leader(within_s=5.0)
        change = {
            "old_leader": leader,
            "new_leader": new_leader,
            "unavailable_s": window,
            "recovered": available,
        }
        self.leader_changes.append(change)
        self.progress(f"  etcd leader {leader} killed; new leader {new_leader} after {window}s")
        await self.stack.start_etcd_member(leader)
        return {"restarted": "etcd", **change}

    async def _leader(self, within_s: float) -> str | None:
        deadline = time.monotonic() + within_s
        while True:
            leader = await self.stack.etcd_leader()
            if leader is not None or time.monotonic() > deadline:
                return leader
            await asyncio.sleep(0.1)

    async def _probe_acquire(self) -> bool:
        """One lock acquire on a probe key through the lock server (session TTL 2 s, left to
        expire). The key is outside `payout:` so it never counts as workload."""
        self._probe_seq += 1
        key = f"chaos:probe-{uuid.uuid4().hex[:8]}-{self._probe_seq}"
        try:
            base, http = self.stack.lock_url, self._http
            s = await http.post(f"{base}/v1/sessions", json={"ttl_s": 2.0}, timeout=1.0)
            if s.status_code != 200:
                return False
            r = await http.post(
                f"{base}/v1/locks/acquire",
                json={"session_id": s.json()["session_id"], "key": key, "wait_s": 0},
                timeout=1.0,
            )
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    # ------------------------------------------------------------------ rail windows

    async def rail(self, patch: dict[str, Any]) -> None:
        r = await self._http.post(f"{self.stack.railstub_url}/admin/behaviour", json=patch)
        r.raise_for_status()

    async def _rail_window(self, fault: Fault) -> dict[str, Any]:
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

    # ------------------------------------------------------------------ the end

    async def close(self) -> None:
        """Release the injector's client and pool (the run's end)."""
        await self._http.aclose()
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 5)

    async def restore(self) -> None:
        """Normal behaviour again: the rail's baseline, every worker running, etcd whole."""
        await self.rail(RAIL_BASELINE)
        for name in self.slots:
            self.stack.kill(name, signal.SIGCONT)
        procs = self.stack.processes
        for name in self.slots:
            info = procs.get(name)
            if info is not None and process_state(info.pid) == "T":
                raise ChaosError(f"{name} is still stopped after SIGCONT")
