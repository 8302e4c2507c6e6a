"""The chaos runner's fault injector: applies scheduled faults to a running local stack.

Owns: the worker fleet of a chaos run (one worker per slot, replaced after a kill; an armed
pause runs its own extra worker, so it never takes a slot's worker away), every fault's mechanics
(SIGSTOP/SIGCONT, SIGKILL, service restarts, a lock-server outage inside the window a release
fails in while sessions survive (lab.chaos.locks), an etcd leader kill with its unavailability
window measured by lock acquires, a SIGKILL of the Temporal dev server or of the rail stub
followed by a restart on the same files and ports, a PostgreSQL failover (SIGKILL of the primary,
promotion of its synchronous standby), the replica faults and a finance-ledger restart
(lab.chaos.replicas), rail stub behaviour windows: outage,
ambiguity, slow lookups, latency beyond the submit deadline, clock skew) and restoring normal
behaviour at the end. Must never: touch a process the stack did not start, or leave a worker
stopped or the rail in a fault mode once `restore()` returned.

The fault families with state of their own live beside it, each composed in: the armed pause
(lab.chaos.armed), the rail stub's windows (lab.chaos.rail), the proxy's attempt record they
read (lab.chaos.attempts), the lock-server outage (lab.chaos.locks), the replica faults
(lab.chaos.replicas) and the hostile signals (lab.chaos.signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from common.credentials import auth_headers
from common.logs import get_logger
from lab.chaos.armed import ArmedPauses
from lab.chaos.attempts import ProxyAttempts
from lab.chaos.locks import LockServerOutage
from lab.chaos.rail import RAIL_BASELINE, RAIL_CLOCK_BASELINE, RailFaults
from lab.chaos.replicas import ReplicaFaults
from lab.chaos.schedule import Fault
from lab.chaos.signals import HostileSignals
from lab.experiments.harness import process_state
from stack.process import ManagedProcess, pid_alive
from stack.system import Stack

log = get_logger("lab.chaos")


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
        submit_deadline_s: float = 90.0,
        lock_outage_s: tuple[float, float] | None = None,
    ) -> None:
        self.stack = stack
        #: lock_server_outage faults (None: a run that schedules none, e.g. the game day).
        self._lock_outage = (
            None if lock_outage_s is None else LockServerOutage(stack, lock_outage_s, progress)
        )
        self.worker_env = worker_env
        self.lease_s = lease_s
        self.progress = progress
        # One HTTP client and one small pool for the whole run: building an httpx client costs an
        # SSL context and a PostgreSQL connection costs a backend process, and the armed pauses
        # and leader-kill probes ask many times a second (they were a fifth of a core).
        # The harness steers the rail stub as the stack's operator; the lock probe below acts as
        # a holder and presents the worker's credential instead.
        self._http = httpx.AsyncClient(timeout=5.0, headers=stack.operator_headers())
        self.attempts = ProxyAttempts(stack)
        self.armed = ArmedPauses(
            stack,
            self.attempts,
            worker_env=worker_env,
            progress=progress,
            workload_done=workload_done,
            submit_deadline_s=submit_deadline_s,
        )
        self.rail_faults = RailFaults(
            stack,
            self._http,
            self.attempts,
            self.armed,
            submit_deadline_s=submit_deadline_s,
            workload_done=workload_done,
        )
        self._hostile_signals = HostileSignals(stack, self._http)
        self.replicas = ReplicaFaults(
            stack,
            self._http,
            db=self.attempts.pool,
            rail=self.rail_faults.rail,
            rail_latency_ms=int(RAIL_BASELINE["latency_fixed_ms"]),
            etcd_leader_kill=self.etcd_leader_kill,
            progress=progress,
        )
        self.slots: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.leader_changes: list[dict[str, Any]] = []
        #: Slot workers found dead (not killed by a fault) and replaced, e.g. after Temporal
        #: vanished: a worker whose client gives up exits, and the run reports it.
        self.workers_replaced: list[dict[str, Any]] = []
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
            await asyncio.gather(*self.armed.tasks)
        finally:
            for task in self.armed.tasks:
                task.cancel()
            await asyncio.gather(*self.armed.tasks, return_exceptions=True)
            self.records.sort(key=lambda r: int(r["index"]))

    async def fire(self, fault: Fault, t0: float, armed: ManagedProcess | None = None) -> None:
        """Fire one fault; an armed pause is started here and finishes in the background."""
        if fault.kind == "pause" and fault.armed:
            self.armed.triggered[fault.index] = asyncio.Event()
            self.armed.tasks.append(asyncio.create_task(self._fire(fault, t0, armed)))
            return
        await self._fire(fault, t0, None)

    async def armed_frozen(self, fault: Fault) -> None:
        """Return once the armed pause `fault` (fired) has frozen its worker, or given up."""
        await self.armed.triggered[fault.index].wait()

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
            "lock_server_outage": self._lock_server_outage,
            "backend_restart": self._backend_restart,
            "rail_outage": self.rail_faults.window,
            "rail_ambiguity": self.rail_faults.window,
            "slow_lookups": self.rail_faults.window,
            "temporal_restart": self._temporal_restart,
            "rail_restart": self.rail_faults.restart,
            "rail_slow": self.rail_faults.slow,
            "clock_skew": self.rail_faults.clock_skew,
            "hostile_signals": self._hostile_signals.fire,
            "db_failover": self._db_failover,
            "finledger_restart": self.replicas.finledger_restart,
            "lock_replica_kill": self.replicas.lock_replica_kill,
            "proxy_replica_kill": self.replicas.proxy_replica_kill,
            "publisher_kill": self.replicas.publisher_kill,
            "replica_freeze": self.replicas.replica_freeze,
            "etcd_member_kill_frozen": self.replicas.etcd_member_kill_frozen,
        }[fault.kind]
        if fault.kind == "pause" and fault.armed:
            record.update(await self.armed.pause(fault, armed))
        else:
            record.update(await handler(fault))
        record["took_s"] = round(time.monotonic() - started, 2)
        log.info("chaos.fault_fired", **record)
        self.records.append(record)

    async def arm(self, fault: Fault) -> ManagedProcess:
        """Start the armed pause's extra worker (`ArmedPauses.arm`), before the workload."""
        return await self.armed.arm(fault)

    async def rail(self, patch: dict[str, Any]) -> None:
        """Patch the rail stub's behaviour (`RailFaults.rail`)."""
        await self.rail_faults.rail(patch)

    @property
    def rail_answered_by(self) -> float:
        """When the rail has answered every submission a rail_slow window slowed."""
        return self.rail_faults.answered_by

    # ------------------------------------------------------------------ worker faults

    async def _pause(self, fault: Fault) -> dict[str, Any]:
        name = self.slots[fault.target]
        async with self.stack.frozen(name):
            await asyncio.sleep(fault.duration_s)
        return {"worker": name, "stopped_s": fault.duration_s}

    async def _kill(self, fault: Fault) -> dict[str, Any]:
        name = self.slots[fault.target]
        self.stack.kill(name, signal.SIGKILL)
        await self.stack.stop_worker(name)  # reaps it; SIGKILL already ended it
        proc = await self.stack.start_worker(None, self.worker_env)
        self.slots[fault.target] = proc.name
        return {"worker": name, "replacement": proc.name}

    # ------------------------------------------------------------------ service faults

    async def _lock_server_restart(self, fault: Fault) -> dict[str, Any]:
        # Replicated: one after the other, as a rolling restart of the service would.
        names = self.stack.service_replicas("lock-server")
        for name in names:
            await self.stack.restart(name)
        return {"restarted": names}

    async def _lock_server_outage(self, fault: Fault) -> dict[str, Any]:
        if self._lock_outage is None:
            raise ChaosError("a lock_server_outage needs the run's outage window")
        return await self._lock_outage(fault)

    async def _backend_restart(self, fault: Fault) -> dict[str, Any]:
        if self.stack.config.backend == "postgres":
            # The embedded PostgreSQL holds the lock tables AND the payment database.
            await self.stack.restart("postgres")
            return {"restarted": "postgres"}
        return await self.etcd_leader_kill()

    async def _db_failover(self, fault: Fault) -> dict[str, Any]:
        """SIGKILL the PostgreSQL primary (lock tables and payment database) mid-run and promote
        its synchronous standby; every client reconnects through the multi-host DSN. Nothing a
        client saw committed is lost (stack.replication); the run's checks prove it."""
        return await self.stack.db_failover()

    async def etcd_leader_kill(self) -> dict[str, Any]:
        """SIGKILL the etcd leader, measure how long lock acquires fail (`probe_acquire`, up to
        60 s), then start the member again; the change is also kept in `leader_changes`. The
        backend_restart fault on etcd, a replica fault (lab.chaos.replicas) and the game day's
        leader-change scenario (lab.gameday.scenarios) fire it."""
        leader = await self._leader(within_s=10.0)
        if leader is None:
            return {"restarted": "etcd", "leader": None, "note": "no leader found"}
        if not await self.probe_acquire():
            self.progress("  warning: lock acquire failed before the leader kill")
        killed_at = time.monotonic()
        await self.stack.stop_etcd_member(leader, signal.SIGKILL)
        # The window: from the kill until a lock acquire succeeds again through the lock server
        # (a new leader elected, the lock server's channel failed over, a grant written).
        available = False
        while time.monotonic() - killed_at < 60.0:
            if await self.probe_acquire():
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

    async def probe_acquire(self) -> bool:
        """One lock acquire on a probe key through the lock server (session TTL 2 s, left to
        expire). The key is outside `payout:` so it never counts as workload."""
        self._probe_seq += 1
        key = f"chaos:probe-{uuid.uuid4().hex[:8]}-{self._probe_seq}"
        try:
            base, http = self.stack.lock_url, self._http
            holder = auth_headers(self.stack.token("worker"))
            s = await http.post(
                f"{base}/v1/sessions", json={"ttl_s": 2.0}, timeout=1.0, headers=holder
            )
            if s.status_code != 200:
                return False
            r = await http.post(
                f"{base}/v1/locks/acquire",
                json={"session_id": s.json()["session_id"], "key": key, "wait_s": 0},
                timeout=1.0,
                headers=holder,
            )
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def _temporal_restart(self, fault: Fault) -> dict[str, Any]:
        """SIGKILL the Temporal dev server (no clean shutdown) and start it again on the same
        SQLite file and ports: every workflow's history must survive, and the workers must
        reconnect by themselves (a slot worker that exited instead is replaced and reported)."""
        killed_at = time.monotonic()
        self.stack.kill("temporal", signal.SIGKILL)
        await self.stack.restart("temporal")  # reaps the killed group, same argv and db file
        down_s = round(time.monotonic() - killed_at, 2)
        replaced = await self.replace_dead_workers(f"temporal_restart #{fault.index}")
        return {"down_s": down_s, "workers_replaced": replaced}

    async def replace_dead_workers(self, cause: str) -> list[str]:
        """Start a new worker in every slot whose worker process has exited."""
        replaced = []
        procs = self.stack.processes
        for slot, name in enumerate(self.slots):
            info = procs.get(name)
            if info is not None and pid_alive(info.pid):
                continue
            with contextlib.suppress(Exception):
                await self.stack.stop_worker(name)  # reap it and drop it from the stack
            proc = await self.stack.start_worker(None, self.worker_env)
            self.slots[slot] = proc.name
            replaced.append(name)
            self.workers_replaced.append({"worker": name, "replacement": proc.name, "cause": cause})
            self.progress(f"  {name} had exited ({cause}); replaced by {proc.name}")
        return replaced

    # ------------------------------------------------------------------ the end

    async def close(self) -> None:
        """Release the injector's client and pool (the run's end)."""
        await self._http.aclose()
        await self.attempts.close()

    async def restore(self) -> None:
        """Normal behaviour again: the rail's baseline, every worker running, etcd whole."""
        await self.rail(RAIL_BASELINE)
        await self.rail_faults.set_clock_skew(float(RAIL_CLOCK_BASELINE["clock_skew_s"]))
        await self.replace_dead_workers("found dead at restore")
        for name in self.slots:
            self.stack.kill(name, signal.SIGCONT)
        procs = self.stack.processes
        for name in self.slots:
            info = procs.get(name)
            if info is not None and process_state(info.pid) == "T":
                raise ChaosError(f"{name} is still stopped after SIGCONT")
