"""The chaos runner's faults on replicas and on the finance ledger (issue 26 §3).

Owns: the mechanics of `lock_replica_kill`, `proxy_replica_kill` (mid-forward, by construction),
`publisher_kill`, `replica_freeze`, `etcd_member_kill_frozen` and `finledger_restart` against a
running stack. Must never: touch a process the stack did not start, or return with a replica
stopped or frozen, or with the rail left slower than its baseline.

Which replica a kill hits matters only for the proxy: the balancer spreads connections by load, so a
seeded proxy replica may be idle at the moment, and a small run may be past all its submissions by
the time the fault fires. The proxy fault therefore slows the rail for a moment (every forward then
lasts PROXY_KILL_RAIL_MS at the rail), starts the payout the runner held back for it (`held_payout`:
one of the run's own payouts, whose workflow starts only now, so a submission is certain to come),
waits until some proxy replica has recorded an attempt it has not yet answered, and kills THAT
replica: the SIGKILL lands between "attempt recorded" and "rail answered", i.e. mid-forward,
whatever the machine's speed. The wait is judged on the held payout's progress, not on a clock:
it lasts while that payout has not yet reached the rail (PENDING or CLAIMED), however slowly a
loaded machine brings it there (a CI run once took longer than a fixed 30 s), up to
PROXY_KILL_HELD_WAIT_S. The worker then sees its connection drop, the payout goes
RAIL_AMBIGUOUS, and only the rail's evidence (looked up through the surviving replica) may settle
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx

from lab.chaos.schedule import Fault
from stack.system import Stack

#: The rail's fixed latency while the proxy fault waits for a forward in flight: long enough for
#: a poll every PROXY_POLL_S to see the attempt unanswered, far inside the submit deadline.
PROXY_KILL_RAIL_MS = 1500
PROXY_POLL_S = 0.05
#: How long the proxy fault waits for any submission at all when no payout was held back for
#: it (a run past its submissions has none): it then kills its seeded replica and reports
#: `mid_forward: false`.
PROXY_KILL_WAIT_S = 30.0
#: With a held payout, the wait lasts while that payout is still on its way to the rail; this
#: only bounds a payout that never gets there (a bug, which the run's record then shows).
PROXY_KILL_HELD_WAIT_S = 300.0
#: The held payout's states before its submission is recorded by a proxy.
_BEFORE_RAIL = ("PENDING", "CLAIMED")

#: The newest attempt a proxy replica recorded and has not answered yet (outcome still NULL).
_IN_FLIGHT = """
SELECT replica_id FROM railproxy.attempts
 WHERE outcome IS NULL AND replica_id = ANY($1::text[]) AND attempt_id > $2
 ORDER BY attempt_id DESC LIMIT 1
"""


@dataclass(frozen=True)
class HeldPayout:
    """The payout the runner held back for the proxy fault: its id, and how to start it."""

    payout_id: str
    start: Callable[[], Awaitable[None]]


#: The held payout's state.
_STATE = "SELECT state FROM paydb.payouts WHERE payout_id = $1"


class ReplicaFaults:
    """Fires the replica faults on `stack`; each returns what it did, for the run's record."""

    def __init__(
        self,
        stack: Stack,
        http: httpx.AsyncClient,
        *,
        db: Callable[[], Awaitable[asyncpg.Pool]],
        rail: Callable[[dict[str, Any]], Awaitable[None]],
        rail_latency_ms: int,
        etcd_leader_kill: Callable[[], Awaitable[dict[str, Any]]],
        progress: Callable[[str], None],
    ) -> None:
        self.stack, self._http, self._db = stack, http, db
        self._rail, self._rail_latency_ms = rail, rail_latency_ms
        self._etcd_leader_kill = etcd_leader_kill
        self.progress = progress
        #: The payout the runner held back for the proxy fault (None: none held back).
        self.held_payout: HeldPayout | None = None

    def _replica(self, service: str, target: int) -> str:
        names = self.stack.service_replicas(service)
        if not names:
            raise RuntimeError(f"the stack runs no {service}")
        return sorted(names)[target % len(names)]

    async def _down_then_restart(self, name: str, down_s: float) -> dict[str, Any]:
        """SIGKILL `name`, keep it down `down_s`, start it again on the same port and env."""
        killed_at = time.monotonic()
        self.stack.kill(name, signal.SIGKILL)
        try:
            await asyncio.sleep(down_s)
        finally:
            await self.stack.restart(name)  # reaps the killed one; waits until it is healthy
        return {"replica": name, "down_s": round(time.monotonic() - killed_at, 2)}

    async def lock_replica_kill(self, fault: Fault) -> dict[str, Any]:
        """One lock-server replica crashes; its peers serve every session (they live in the
        backend) and the balancer stops sending it connections within a second."""
        return await self._down_then_restart(
            self._replica("lock-server", fault.target), fault.duration_s
        )

    async def publisher_kill(self, fault: Fault) -> dict[str, Any]:
        """One outbox publisher crashes with a batch claimed: its claim's lease runs out and a
        peer delivers the rows; the ledger answers a redelivered key as a duplicate."""
        return await self._down_then_restart(
            self._replica("outbox", fault.target), fault.duration_s
        )

    async def proxy_replica_kill(self, fault: Fault) -> dict[str, Any]:
        """SIGKILL the proxy replica that is forwarding a submission right now (see the module
        docstring), then start it again."""
        names = self.stack.service_replicas("railproxy")
        pool = await self._db()
        newest = await pool.fetchval("SELECT coalesce(max(attempt_id), 0) FROM railproxy.attempts")
        await self._rail({"latency_fixed_ms": PROXY_KILL_RAIL_MS})
        held = self.held_payout
        started = time.monotonic()
        victim: str | None = None
        try:
            if held is not None:
                await held.start()
            victim, held_state = await self._forward_in_flight(pool, names, newest, held)
            mid_forward = victim is not None
            name = victim or self._replica("railproxy", fault.target)
            waited_s = round(time.monotonic() - started, 2)
            record = await self._down_then_restart(name, fault.duration_s)
        finally:
            await self._rail({"latency_fixed_ms": self._rail_latency_ms})
        if not mid_forward:
            self.progress(
                f"  no submission in flight after {waited_s:.0f}s"
                f" (held payout: {held_state or 'none'}): killed idle"
            )
        return {**record, "mid_forward": mid_forward, "waited_s": waited_s}

    async def _forward_in_flight(
        self, pool: asyncpg.Pool, names: list[str], newest: int, held: HeldPayout | None
    ) -> tuple[str | None, str | None]:
        """The replica of a submission recorded after `newest` and not yet answered, polled
        while the held payout is still on its way to the rail (without one, for
        PROXY_KILL_WAIT_S); and the held payout's last state seen."""
        started = time.monotonic()
        cap = PROXY_KILL_HELD_WAIT_S if held is not None else PROXY_KILL_WAIT_S
        state: str | None = None
        reported = started
        while time.monotonic() - started < cap:
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                victim = await pool.fetchval(_IN_FLIGHT, names, newest)
                if victim is not None:
                    return victim, state
                if held is not None:
                    state = await pool.fetchval(_STATE, held.payout_id)
            if held is not None and state is not None and state not in _BEFORE_RAIL:
                return None, state  # it reached the rail between two polls, unseen
            if time.monotonic() - reported >= 15:
                reported = time.monotonic()
                self.progress(f"  waiting for a submission in flight (held payout: {state})")
            await asyncio.sleep(PROXY_POLL_S)
        return None, state

    async def replica_freeze(self, fault: Fault) -> dict[str, Any]:
        """SIGSTOP one replica for longer than a lease and every client timeout: requests on
        its open connections hang until the clients give up, its health checks fail, and the
        peers must carry the load. SIGCONT at the end, whatever happened meanwhile."""
        name = self._replica(fault.service, fault.target)
        async with self.stack.frozen(name):
            await asyncio.sleep(fault.duration_s)
        return {"replica": name, "frozen_s": fault.duration_s}

    async def etcd_member_kill_frozen(self, fault: Fault) -> dict[str, Any]:
        """The etcd leader is killed while one lock-server replica is frozen: the live replica
        must fail over to the new leader on its own, and the frozen one, thawed after the
        election, must find its watches and leases on a cluster that moved on."""
        name = self._replica("lock-server", fault.target)
        async with self.stack.frozen(name):
            change = await self._etcd_leader_kill()
        return {"frozen_replica": name, **change}

    async def finledger_restart(self, fault: Fault) -> dict[str, Any]:
        """SIGKILL the finance ledger and start it again on the same book file: a real ledger
        keeps its records, so a redelivery after the restart is answered as a duplicate, never
        booked twice (the run's downstream check counts both)."""
        before = await self._ledger_count()
        self.stack.kill("finledger", signal.SIGKILL)
        await self.stack.restart("finledger")
        after = await self._ledger_count()
        return {"records_before": before, "records_after": after}

    async def _ledger_count(self) -> int | None:
        url = self.stack.finledger_url
        if url is None:
            return None
        try:
            r = await self._http.get(f"{url}/v1/count", timeout=30)
            r.raise_for_status()
            return int(r.json()["count"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None
