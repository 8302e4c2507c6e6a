"""A grant issued while Temporal is down, with a REAL restart of the Temporal dev server (issue
16): after the restart the account's key is never left held by a grant nobody has.

The test runs a dev server of its own, on fixed ports and a persistent SQLite file, so that it can
be stopped (SIGTERM, or SIGKILL; waited for) and started again with the same state: histories,
timers and task queues survive, the workers and clients are not restarted and reconnect by
themselves. The payout's acquire waits at the lock server for the account's key, which the test
holds; Temporal is stopped; the test lets the key go, so the lock server grants it to the waiting
acquire while Temporal is down. The worker's hand-over of that grant (it completes the acquire
activity itself) then fails with UNAVAILABLE and is retried. In the two-task shape
(acquire_and_execute) the worker pays the payout under that grant first (the database and the proxy
are up), releases it, then hands the result over the same way. Two outages:

- short (Temporal back well inside the acquire's start-to-close; after a clean shutdown and after
  a crash): the completion reaches Temporal, and the workflow runs its critical section under
  that grant; or, if Temporal refused it (the attempt timed out meanwhile), the grant was given
  back and the workflow re-acquired;
- long (Temporal down past the acquire's start-to-close): the worker gives the grant back while
  Temporal is still down, the attempt times out when Temporal returns, and the workflow
  re-acquires with a higher token.

Asserted from the lock server's grant history and inspect, the payment database, the workflow's
status and its recorded history (which replays), never from the clock. Set RECORD_HISTORIES=1 to
(re)write the long outage's replay history (an acquire timed out across the restart).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from activities import models as m
from common.lockkey import lock_key
from common.migrate import migrate
from lockservice.sdk import LockClient
from stack.embedded.shared import free_port
from stack.embedded.temporal import temporal_binary
from stack.services import TEMPORAL_SQLITE_PRAGMAS
from tests.credentials import token
from tests.workflows.integration import record
from tests.workflows.system import (
    InProcessWorker,
    System,
    create_payout,
    fund,
    in_process_workers,
    key_grants,
    lock_info,
    running_system,
    wait_for,
)
from workflows.payout import PayoutWorkflow
from workflows.search_attributes import dev_server_flags

pytestmark = pytest.mark.slow


class RestartableTemporal:
    """A Temporal dev server on fixed ports and a persistent database file: stopped and started
    again, it is the same server (as the local stack's, and chaos' `temporal_restart`)."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.address = f"127.0.0.1:{free_port()}"
        self._log = run_dir / "temporal.log"
        self._argv = [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            self.address.rsplit(":", 1)[1],
            "--http-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--headless",
            *dev_server_flags(),
            "--db-filename",
            str(run_dir / "temporal.db"),
            *TEMPORAL_SQLITE_PRAGMAS,
            "--log-level",
            "warn",
        ]
        self._proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        """Start it on the same ports and database file, and wait until it serves."""
        self._proc = await asyncio.to_thread(self._spawn)
        await wait_for(self._healthy, timeout_s=60.0)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self._log, "ab") as out:
            return subprocess.Popen(
                self._argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    async def serving(self) -> None:
        """Started again if a previous test left it stopped (it failed while Temporal was down)."""
        if self._proc is None or self._proc.poll() is not None:
            await self.start()

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal it (SIGTERM: a clean shutdown; SIGKILL: a crash), and wait for the process to
        exit: its port is dead afterwards."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)

    async def _healthy(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise RuntimeError(f"temporal exited:\n{self._log.read_text()[-3000:]}")
        check = await asyncio.create_subprocess_exec(
            self._argv[0],
            "operator",
            "cluster",
            "health",
            "--address",
            self.address,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await check.wait() == 0


@pytest.fixture(scope="module")
def system(database_url: str, run_dir: Path) -> Iterator[System]:
    asyncio.run(migrate(database_url))
    with running_system(database_url, run_dir / f"restart-{uuid.uuid4().hex[:6]}") as sys_:
        yield sys_


@pytest.fixture(scope="module")
async def temporal(run_dir: Path) -> AsyncIterator[RestartableTemporal]:
    server = RestartableTemporal(run_dir / f"temporal-{uuid.uuid4().hex[:6]}")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _payout_row(database_url: str, payout_id: str) -> tuple[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow(
            "SELECT state, fence FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
    finally:
        await conn.close()
    assert row is not None
    return str(row["state"]), int(row["fence"])


def _acquire_outcomes(history: WorkflowHistory) -> list[str]:
    """How each acquire activity of the run ended, in order: completed, timed_out, failed."""
    scheduled: dict[int, bool] = {}  # event id -> is an acquire
    outcomes = {
        EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("completed", "activity_task_completed"),
        EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("timed_out", "activity_task_timed_out"),
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("failed", "activity_task_failed"),
    }
    seen: list[str] = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = attrs.activity_type.name in (
                m.ACQUIRE_LOCK,
                m.ACQUIRE_AND_EXECUTE,
            )
        elif e.event_type in outcomes:
            name, field = outcomes[e.event_type]
            if scheduled.get(getattr(e, f"{field}_event_attributes").scheduled_event_id):
                seen.append(name)
    return seen


@dataclass(frozen=True)
class Outage:
    """How long Temporal stays down, said by what it outlasts (never by a duration)."""

    name: str
    acquire_wait_s: float  # the acquire's start-to-close is this + 5 s (workflows/payout.py)
    past_start_to_close: bool
    sig: signal.Signals = signal.SIGTERM
    #: The two-task shape (acquire_and_execute): the grant obtained while Temporal is down is
    #: used at once (the payout is paid: the database and the proxy are up), then handed over.
    #: The others take the three-task shape, whose acquire alone is handed over.
    two_task: bool = False


SHORT = Outage("short", acquire_wait_s=60.0, past_start_to_close=False)
# A crash instead of a clean shutdown (as chaos' `temporal_restart`): the SQLite file in WAL mode
# keeps what the server had committed.
CRASH = Outage("short-sigkill", acquire_wait_s=60.0, past_start_to_close=False, sig=signal.SIGKILL)
# Small, so that the attempt times out in seconds; long enough that Temporal is down (SIGTERM
# waited for, about a second here) before the acquire's wait at the lock server runs out.
LONG = Outage("long", acquire_wait_s=8.0, past_start_to_close=True)
TWO_TASK = Outage("two-task-short", acquire_wait_s=60.0, past_start_to_close=False, two_task=True)


@pytest.mark.parametrize("outage", [SHORT, CRASH, LONG, TWO_TASK], ids=lambda o: o.name)
async def test_a_grant_issued_while_temporal_is_down_is_delivered_or_given_back(
    outage: Outage, temporal: RestartableTemporal, system: System
) -> None:
    payout_id = f"po-{uuid.uuid4().hex[:10]}"
    account_id = f"acct-{payout_id[3:]}"
    key = lock_key(account_id)
    await fund(system.database_url, account_id, 10_000)
    await create_payout(system.database_url, payout_id, account_id, 100)
    await temporal.serving()
    client = await Client.connect(temporal.address)
    queue = f"payouts-{uuid.uuid4()}"
    async with (
        LockClient(system.lock_url, ttl_s=3.0, heartbeat_s=0.75, token=token("worker")) as other,
        in_process_workers(client, system, queue, count=1) as [worker],
    ):
        blocker = await other.acquire(key)
        inp = m.PayoutInput(
            payout_id=payout_id,
            account_id=account_id,
            acquire_wait_s=outage.acquire_wait_s,
            base_backoff_s=0.2,
            max_backoff_s=1.0,
            # Longer than the outage: the acquire's last heartbeat before the stop does not time
            # it out at the restart (which would only be the re-acquire branch once more).
            holder_heartbeat_timeout_s=30.0,
            two_task=outage.two_task,
        )
        handle = await client.start_workflow(
            PayoutWorkflow.run, inp, id=f"payout-{payout_id}", task_queue=queue
        )

        async def acquire_waiting() -> bool:
            waiting: bool = lock_info(system, key)["waiters"] == 1
            return waiting

        await wait_for(acquire_waiting)
        await temporal.stop(outage.sig)
        await other.release(blocker)

        async def granted_while_down() -> bool:
            return len(key_grants(system, key)) == 2 and worker.acts.handovers == 1

        # The lock server granted the waiting acquire; its hand-over is retrying (unavailable).
        await wait_for(granted_while_down)
        if outage.past_start_to_close:
            await _given_back_while_down(system, key, worker)
        await temporal.start()
        status = await handle.result()
        history = await handle.fetch_history()
        if outage.past_start_to_close:
            await record(handle, "temporal_restart_acquire_timed_out")

        async def key_free() -> bool:  # the workflow's release is best effort, not awaited
            return lock_info(system, key)["token"] is None

        await wait_for(key_free)
        # The next acquire of the account, by another session: granted, higher token.
        nxt = await other.acquire(key, wait_s=10.0)
        await other.release(nxt)
        sessions = (other.session_id, worker.locks.session_id)
        leases_left = len(worker.acts.grants)
    await _check(outage, system, key, payout_id, sessions, status, history, leases_left)


async def _given_back_while_down(system: System, key: str, worker: InProcessWorker) -> None:
    """The attempt's start-to-close passes with Temporal still down: the worker stops retrying
    and releases the grant, before Temporal can say anything."""

    async def released() -> bool:
        grants = key_grants(system, key)
        return worker.acts.handovers == 0 and grants[-1]["end_reason"] == "released"

    # Bounded by the start-to-close plus the Temporal client's own retry of one completion call
    # (up to 10 s), with room for a loaded machine.
    await wait_for(released, timeout_s=60.0)
    assert lock_info(system, key)["token"] is None


async def _check(
    outage: Outage,
    system: System,
    key: str,
    payout_id: str,
    sessions: tuple[str | None, str | None],
    status: m.PayoutStatus,
    history: WorkflowHistory,
    leases_left: int,
) -> None:
    test_session, worker_session = sessions
    grants = key_grants(system, key)
    _blocked, in_flight, *rest, after = grants
    state, fence = await _payout_row(system.database_url, payout_id)
    assert (status.state, state) == ("POSTED", "POSTED")
    acquires = _acquire_outcomes(history)
    if rest:
        # Given back (lock.grant_undelivered): the attempt it answered had timed out, so the
        # workflow re-acquired, and paid under the later grant.
        assert in_flight["end_reason"] == "released"
        assert acquires[0] == "timed_out" and acquires[-1] == "completed"
        paid_under = rest[-1]
    else:
        assert not outage.past_start_to_close, "the long outage must give the grant back"
        assert acquires == ["completed"]
        paid_under = in_flight
    # Every grant but the test's two was the worker's session's, and ended released by it: none
    # was left to expire, nor held by an orphan once the payout was terminal.
    assert [g["session_id"] for g in grants] == [
        test_session,
        *[worker_session] * (len(grants) - 2),
        test_session,
    ]
    assert all(g["end_reason"] == "released" for g in grants)
    assert leases_left == 0
    tokens = [int(str(g["token"])) for g in grants]
    assert tokens == sorted(set(tokens))
    assert status.token == fence == int(str(paid_under["token"]))
    assert int(str(after["token"])) > fence
    # The run recorded across the restart replays against the current workflow code.
    await Replayer(workflows=[PayoutWorkflow]).replay_workflow(history)
