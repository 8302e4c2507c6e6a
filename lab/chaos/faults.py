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
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx

from common.credentials import auth_headers
from common.logs import get_logger
from common.pgutil import create_pool
from lab.chaos.locks import LockServerOutage
from lab.chaos.replicas import ReplicaFaults
from lab.chaos.schedule import Fault
from lab.chaos.signals import HostileSignals
from lab.experiments.pause_crash import json_events, process_state, resumed_then_submitted
from stack.process import ManagedProcess, pid_alive
from stack.system import Stack

log = get_logger("lab.chaos")

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
ARMED_ENV = {"WORKER_EXPERIMENT_PAUSE_BEFORE_SUBMIT": "true"}
#: How long an armed worker may take to reach its first submission before the fault gives up.
ARMED_TRIGGER_WAIT_S = 90.0
#: An armed worker is thawed at the latest this long before its frozen request's deadline, so the
#: thawed request still reaches the proxy's fence checks (the proxy refuses a request whose
#: deadline is too close before anything else).
ARMED_SEND_MARGIN_S = 5.0
#: After the thaw, how long the armed worker gets to make its stale attempt before it is stopped.
ARMED_ATTEMPT_WAIT_S = 30.0
#: A rail_slow window stays open past its seeded duration until at least one submission reached
#: the proxy in it (a small run may have none in a few seconds), but no longer than this.
RAIL_SLOW_MAX_OPEN_S = 30.0


#: What a query from the injector may meet while PostgreSQL is being restarted by a fault.
_DB_UNAVAILABLE = (
    TimeoutError,
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # A restart can leave a pooled connection mid-protocol (as in railproxy.service).
    asyncpg.InternalClientError,
)


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
        #: The payouts' submit deadline: a rail_slow window's latency exceeds it.
        self.submit_deadline_s = submit_deadline_s
        self.worker_env = worker_env
        self.lease_s = lease_s
        self.progress = progress
        # One HTTP client and one small pool for the whole run: building an httpx client costs an
        # SSL context and a PostgreSQL connection costs a backend process, and the armed pauses
        # and leader-kill probes ask many times a second (they were a fifth of a core).
        # The harness steers the rail stub as the stack's operator; the lock probe below acts as
        # a holder and presents the worker's credential instead.
        self._http = httpx.AsyncClient(timeout=5.0, headers=stack.operator_headers())
        self._hostile_signals = HostileSignals(stack, self._http)
        self.replicas = ReplicaFaults(
            stack,
            self._http,
            db=self._db,
            rail=self.rail,
            rail_latency_ms=int(RAIL_BASELINE["latency_fixed_ms"]),
            etcd_leader_kill=self._etcd_leader_kill,
            progress=progress,
        )
        self._pool: asyncpg.Pool | None = None
        self.workload_done = workload_done
        self.slots: list[str] = []
        self.records: list[dict[str, Any]] = []
        #: Armed pauses in progress: each runs in the background with its own extra worker, so
        #: its long freeze (until a newer holder submits) does not hold up the rest of the schedule.
        self._armed: list[asyncio.Task[None]] = []
        #: Per armed pause (by fault index): set once its worker froze itself, or gave up.
        self._armed_triggered: dict[int, asyncio.Event] = {}
        self.leader_changes: list[dict[str, Any]] = []
        #: Slot workers found dead (not killed by a fault) and replaced, e.g. after Temporal
        #: vanished: a worker whose client gives up exits, and the run reports it.
        self.workers_replaced: list[dict[str, Any]] = []
        self._probe_seq = 0
        #: Monotonic time by which the rail has answered every submission a rail_slow window
        #: slowed: the evidence is only complete after it (the runner waits for it).
        self.rail_answered_by = 0.0

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
            self._armed_triggered[fault.index] = asyncio.Event()
            self._armed.append(asyncio.create_task(self._fire(fault, t0, armed)))
            return
        await self._fire(fault, t0, None)

    async def armed_frozen(self, fault: Fault) -> None:
        """Return once the armed pause `fault` (fired) has frozen its worker, or given up."""
        await self._armed_triggered[fault.index].wait()

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
            "rail_outage": self._rail_window,
            "rail_ambiguity": self._rail_window,
            "slow_lookups": self._rail_window,
            "temporal_restart": self._temporal_restart,
            "rail_restart": self._rail_restart,
            "rail_slow": self._rail_slow,
            "clock_skew": self._clock_skew,
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
            record.update(await self._armed_pause(fault, armed))
        else:
            record.update(await handler(fault))
        record["took_s"] = round(time.monotonic() - started, 2)
        log.info("chaos.fault_fired", **record)
        self.records.append(record)

    # ------------------------------------------------------------------ worker faults

    async def _pause(self, fault: Fault) -> dict[str, Any]:
        name = self.slots[fault.target]
        async with self.stack.frozen(name):
            await asyncio.sleep(fault.duration_s)
        return {"worker": name, "stopped_s": fault.duration_s}

    async def arm(self, fault: Fault) -> ManagedProcess:
        """Start an extra worker with the UC-03 hook armed (it SIGSTOPs itself just before its
        first rail submission). It is not a slot's worker, so the slot faults (pause, kill) never
        touch it. Separate from `fire` so fault #0 is armed before the workload starts."""
        return await self.stack.start_worker(None, {**self.worker_env, **ARMED_ENV})

    async def _armed_pause(self, fault: Fault, proc: ManagedProcess | None) -> dict[str, Any]:
        triggered = self._armed_triggered.setdefault(fault.index, asyncio.Event())
        try:
            if proc is None:
                proc = await self.arm(fault)
        except BaseException:
            triggered.set()  # the worker never started: nothing will trigger
            raise
        try:
            return await self._armed_freeze(proc, triggered)
        finally:
            triggered.set()  # whatever happened, nothing waits on this pause any longer
            # Its one stale attempt is made (or it never froze): the fleet is the slots again.
            with contextlib.suppress(Exception):
                self.stack.kill(proc.name, signal.SIGCONT)
                await self.stack.stop_worker(proc.name)

    async def _armed_freeze(self, proc: ManagedProcess, triggered: asyncio.Event) -> dict[str, Any]:
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
            newer = await self._newer_attempt(payout_id, token)
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

    async def _db(self) -> asyncpg.Pool:
        """The injector's one small pool, created on first use."""
        if self._pool is None:
            self._pool = await create_pool(
                self.stack.database_url, min_size=0, max_size=2, timeout=5
            )
        return self._pool

    async def _newer_attempt(self, payout_id: str, token: int) -> bool:
        """Whether the proxy has recorded a submission of the payout under a higher token."""
        # Armed pauses run beside the other faults: PostgreSQL may be restarting right now.
        try:
            top = await (await self._db()).fetchval(
                "SELECT max(token) FROM railproxy.attempts WHERE payout_id = $1", payout_id
            )
        except _DB_UNAVAILABLE:
            return False
        return top is not None and int(top) > token

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
        return await self._etcd_leader_kill()

    async def _db_failover(self, fault: Fault) -> dict[str, Any]:
        """SIGKILL the PostgreSQL primary (lock tables and payment database) mid-run and promote
        its synchronous standby; every client reconnects through the multi-host DSN. Nothing a
        client saw committed is lost (stack.replication); the run's checks prove it."""
        return await self.stack.db_failover()

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

    async def _rail_restart(self, fault: Fault) -> dict[str, Any]:
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
            r = await self._http.get(f"{self.stack.railstub_url}/admin/movements", timeout=30)
            r.raise_for_status()
            return len(r.json()["movements"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None

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

    async def _rail_slow(self, fault: Fault) -> dict[str, Any]:
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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(e.wait() for e in self._armed_triggered.values())),
                ARMED_TRIGGER_WAIT_S,
            )
        waited_s = round(time.monotonic() - waited, 2)
        before = await self._last_attempt_id()
        opened = time.monotonic()
        await self.rail(on)
        try:
            await asyncio.sleep(fault.duration_s)
            slowed = await self._attempts_since(before)
            while (
                not slowed
                and time.monotonic() - opened < RAIL_SLOW_MAX_OPEN_S
                and not self.workload_done()
            ):
                await asyncio.sleep(0.25)
                slowed = await self._attempts_since(before)
        finally:
            await self.rail({"latency_fixed_ms": RAIL_BASELINE["latency_fixed_ms"]})
            self.rail_answered_by = max(
                self.rail_answered_by, time.monotonic() + latency_ms / 1000 + 1.0
            )
        return {
            "window_s": round(time.monotonic() - opened, 2),
            "submit_deadline_s": self.submit_deadline_s,
            "slowed_attempts": await self._attempts_since(before),
            "waited_for_armed_s": waited_s,
            **on,
        }

    async def _last_attempt_id(self) -> int | None:
        """The proxy's newest attempt id (None: the database is unreachable right now)."""
        try:
            value = await (await self._db()).fetchval(
                "SELECT coalesce(max(attempt_id), 0) FROM railproxy.attempts"
            )
        except _DB_UNAVAILABLE:
            return None
        return int(value)

    async def _attempts_since(self, before: int | None) -> int:
        """Submissions the proxy recorded (and so forwarded, or tried to) after `before`."""
        now = await self._last_attempt_id()
        return 0 if now is None or before is None else now - before

    async def _clock_skew(self, fault: Fault) -> dict[str, Any]:
        """The rail's clock runs `level` seconds off ours for the window (the stub's
        `clock_skew_s` knob). A stub without the knob drops the field: the record says the
        fault was not applied and the run goes on."""
        applied = await self._set_clock_skew(fault.level)
        if not applied:
            return {"clock_skew_s": fault.level, "applied": False}
        try:
            await asyncio.sleep(fault.duration_s)
        finally:
            await self._set_clock_skew(0.0)
        return {"window_s": fault.duration_s, "clock_skew_s": fault.level, "applied": True}

    async def _set_clock_skew(self, skew_s: float) -> bool:
        """True when the stub took the offset (it echoes its whole behaviour back)."""
        r = await self._http.post(
            f"{self.stack.railstub_url}/admin/behaviour", json={"clock_skew_s": skew_s}
        )
        if r.status_code == 422:
            return False
        r.raise_for_status()
        return bool(r.json().get("clock_skew_s") == skew_s)

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
        await self._set_clock_skew(float(RAIL_CLOCK_BASELINE["clock_skew_s"]))
        await self.replace_dead_workers("found dead at restore")
        for name in self.slots:
            self.stack.kill(name, signal.SIGCONT)
        procs = self.stack.processes
        for name in self.slots:
            info = procs.get(name)
            if info is not None and process_state(info.pid) == "T":
                raise ChaosError(f"{name} is still stopped after SIGCONT")
