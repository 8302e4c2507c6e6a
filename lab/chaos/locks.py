"""The chaos run's lock faults and lock evidence (issue 24 item 6): the lock-server outage
(SIGKILL the lock server, keep it down for an outage drawn from the window in which a worker's
release fails while its session survives, then start it again on the same port), and, at the
end of the run, the wait until no account's lock is held (or held past INV-10's bound).

The window: longer than the SDK's bounded retries of one call (`lockservice.sdk.calls
.retry_budget_s`, what a release spends against a server that refuses connections, as a
SIGKILLed one does: the release then fails and must be kept pending), and shorter than the
session TTL minus one heartbeat (the last successful keepalive may be a heartbeat old when the
server dies; the session must outlive the outage, else it would free its grants by itself and
the fault would test nothing). Both come from what the run's workers are configured with, so the
window follows any change of the SDK's retries or of the run's lease.

Owns: the window's derivation, the outage's mechanics and its record (planned and measured
outage, whether it fell inside the window), the run's source of the locks held now and the wait
for them to be given back. Must never: touch a process the stack did not start, leave the lock
server down once the fault returned, or release or revoke a lock (the checker judges what is
left).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from invariants.checker import HoldSource, lock_server_hold_source, postgres_hold_source
from lab.chaos.schedule import Fault
from lockservice.sdk import retry_budget_s
from stack.system import Stack

#: Room on either side of the window: a retry budget's last backoff and a heartbeat's jitter.
MARGIN_S = 0.5
#: A first guess of how long the lock server takes to start and answer /health: 0.5-0.75 s on an
#: idle 2-core machine, 3.9 s seen on a loaded one. The longest restart seen so far is used
#: after (an overestimate only makes the outage shorter, and the window's floor still holds).
FIRST_RESTART_GUESS_S = 2.5


def outage_window(
    *, ttl_s: float, heartbeat_s: float, budget_s: float, margin_s: float = MARGIN_S
) -> tuple[float, float]:
    """(shortest, longest) outage that a release fails in while the session survives."""
    low, high = budget_s + margin_s, ttl_s - heartbeat_s - margin_s
    if high <= low:
        raise ValueError(
            f"no lock-server outage window: a release gives up after {budget_s:.2f}s and a"
            f" session of {ttl_s}s (heartbeat {heartbeat_s}s) may expire after {high:.2f}s"
        )
    return round(low, 2), round(high, 2)


def workers_outage_window(worker_env: Mapping[str, str]) -> tuple[float, float]:
    """The window of a run whose workers get `worker_env` (WORKER_LOCK_TTL_S and
    WORKER_LOCK_HEARTBEAT_S; the worker's defaults otherwise, worker/settings.py), with the SDK's
    own retries (worker/process.py builds its LockClient with the SDK's default attempts and
    backoffs)."""
    return outage_window(
        ttl_s=float(worker_env.get("WORKER_LOCK_TTL_S", "15")),
        heartbeat_s=float(worker_env.get("WORKER_LOCK_HEARTBEAT_S", "5")),
        budget_s=retry_budget_s(),
    )


class LockServerOutage:
    """Fires `lock_server_outage` faults on one stack; keeps the last measured restart time."""

    def __init__(
        self, stack: Stack, window: tuple[float, float], progress: Callable[[str], None]
    ) -> None:
        self.stack, self.window, self.progress = stack, window, progress
        self.restart_s = FIRST_RESTART_GUESS_S

    async def __call__(self, fault: Fault) -> dict[str, Any]:
        low, high = self.window
        killed_at = time.monotonic()
        # The whole service is out: every replica (a replicated stack's balancer then has none).
        names = self.stack.service_replicas("lock-server")
        for name in names:
            self.stack.kill(name, signal.SIGKILL)
        # Down for the planned outage, less what the restart itself will take; never less than
        # the window's floor, so the release in flight always fails first.
        down_s = max(low, fault.duration_s - self.restart_s)
        try:
            await asyncio.sleep(down_s)
        finally:
            started = time.monotonic()
            # All at once: restarted one after the other, two replicas took twice as long, and
            # 4 of 4 outages of a 2000-payout run overran the window (10.9-15.4 s) into the
            # sessions' TTL, which is not the fault this is.
            await asyncio.gather(*(self.stack.restart(n) for n in names))  # same port and env
        back = time.monotonic()
        self.restart_s = max(self.restart_s, back - started)
        outage = round(back - killed_at, 2)
        inside = low <= outage <= high
        self.progress(
            f"  lock server down {outage}s (planned {fault.duration_s}s, window {low}-{high}s"
            + ("" if inside else ", OUTSIDE: the restart took longer than planned")
            + ")"
        )
        return {
            "planned_s": fault.duration_s,
            "outage_s": outage,
            "restart_s": round(back - started, 2),
            "window_s": [low, high],
            "in_window": inside,
        }


def hold_source(stack: Stack) -> HoldSource:
    """The locks held now, read as the invariant checker reads them (its role, its token)."""
    if stack.config.backend == "postgres":
        return postgres_hold_source(stack.role_dsn("CHECKER_DATABASE_URL"))
    return lock_server_hold_source(stack.lock_url, token=stack.token("invariants"))


async def wait_for_free_locks(
    holds: HoldSource,
    accounts: list[str],
    bound_s: float,
    progress: Callable[[str], None],
) -> int:
    """After settling, wait until no payout lock of the run's accounts is held, for at most
    `bound_s` (INV-10's: a holding unused that long blocks its account) plus a poll; returns how
    many are still held. Every payout is terminal by now, so a lock still held has no work
    under it: a healthy worker gives it back within seconds (its workflow's release, or its
    idle sweeper within WORKER_LEASE_IDLE_S); one held past the bound is what the checker then
    reports, instead of the run missing it by checking too early."""
    deadline = time.monotonic() + bound_s + 5.0
    held = list(await holds(accounts))
    if held:
        progress(f"waiting up to {bound_s + 5:.0f}s for {len(held)} payout lock(s) to be released")
    while held and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        held = list(await holds(accounts))
    if held:
        progress(f"{len(held)} payout lock(s) still held: {sorted(h.key for h in held)[:5]}")
    return len(held)
