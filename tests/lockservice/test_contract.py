"""The lock contract, run against BOTH real backends (PostgreSQL and etcd) with one suite (FR-09).

Mutual exclusion is checked from a recorded history of grant intervals, never by sleeping and
hoping; every history check has a negative control.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from lockservice.api import (
    BackendUnavailable,
    Grant,
    InvalidRequest,
    LockBackend,
    NotAcquired,
    NotHeld,
    SessionNotFound,
)
from lockservice.server import create_backend
from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import EmbeddedPostgres
from tests.lockservice.conftest import BackendFactory, until_available


@dataclass(frozen=True)
class Held:
    """One grant as its holder saw it: from acquire's return until release was called."""

    token: int
    start: float  # monotonic, right after acquire returned
    end: float  # monotonic, right before release was called


def check_exclusive(history: list[Held]) -> None:
    """INV-06 + INV-04 over a recorded history: tokens unique and increasing in grant order, and no
    two grant intervals overlap."""
    by_token = sorted(history, key=lambda h: h.token)
    tokens = [h.token for h in by_token]
    assert len(set(tokens)) == len(tokens), "a token was issued twice"
    by_start = [h.token for h in sorted(history, key=lambda h: h.start)]
    assert by_start == tokens, "a later grant carries a lower token"
    for prev, nxt in itertools.pairwise(by_token):
        assert prev.end < nxt.start, f"grants {prev.token} and {nxt.token} overlap"


async def _acquire(backend: LockBackend, sid: str, key: str, wait_s: float = 10) -> Grant:
    got = await backend.acquire(sid, key, wait_s)
    assert isinstance(got, Grant), got
    return got


async def _wait_until_waiting(
    backend: LockBackend, key: str, blocked: asyncio.Task[Grant | NotAcquired]
) -> None:
    """Until `blocked` (an acquire of `key`) has found the key held and counts as its waiter."""
    deadline = time.monotonic() + 10
    while (await backend.inspect(key)).waiters != 1:
        assert time.monotonic() < deadline, "the blocked acquirer never showed up as a waiter"
        assert not blocked.done(), blocked.result()
        await asyncio.sleep(0.02)


async def _wait_until_free(backend: LockBackend, key: str, budget_s: float = 15) -> None:
    deadline = time.monotonic() + budget_s
    while (await backend.inspect(key)).holder_session is not None:
        assert time.monotonic() < deadline, f"{key} still held after {budget_s}s"
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- history checker


def test_history_checker_rejects_overlap_and_reuse() -> None:
    """Negative control: the history checker fails on overlapping, reused or out-of-order tokens."""
    check_exclusive([Held(1, 0.0, 1.0), Held(2, 1.5, 2.0)])
    with pytest.raises(AssertionError, match="overlap"):
        check_exclusive([Held(1, 0.0, 1.0), Held(2, 0.5, 2.0)])  # starts inside the first
    with pytest.raises(AssertionError, match="twice"):
        check_exclusive([Held(1, 0.0, 1.0), Held(1, 1.5, 2.0)])
    with pytest.raises(AssertionError, match="lower token"):
        check_exclusive([Held(5, 0.0, 1.0), Held(3, 1.5, 2.0)])


# --------------------------------------------------------------------------- sessions


async def test_session_open_keepalive_close(backend: LockBackend) -> None:
    """A session can be kept alive; closing it releases its locks; a closed one is unknown."""
    s = await backend.open_session(5)
    assert s.ttl_s >= 5
    again = await backend.keepalive(s.session_id)
    assert again.session_id == s.session_id
    await _acquire(backend, s.session_id, "k")
    await backend.close_session(s.session_id)
    assert (await backend.inspect("k")).holder_session is None
    with pytest.raises(SessionNotFound):
        await backend.keepalive(s.session_id)
    with pytest.raises(SessionNotFound):
        await backend.acquire(s.session_id, "k", 0)
    await backend.close_session(s.session_id)  # closing twice is a no-op
    with pytest.raises(SessionNotFound):
        await backend.keepalive("no-such-session")


async def test_invalid_input_is_rejected_and_writes_nothing(backend: LockBackend) -> None:
    """Bad key, TTL, wait budget, operator or reason raise InvalidRequest and change nothing."""
    s = await backend.open_session(5)
    for ttl in (0, -1, 0.5, 1e9):
        with pytest.raises(InvalidRequest):
            await backend.open_session(ttl)
    for key in ("", "x" * 257, "bad key", "k|v"):
        with pytest.raises(InvalidRequest):
            await backend.acquire(s.session_id, key, 0)
    with pytest.raises(InvalidRequest):
        await backend.acquire(s.session_id, "k", -1)
    with pytest.raises(InvalidRequest):
        await backend.force_revoke("k", "", "stuck")
    with pytest.raises(InvalidRequest):
        await backend.force_revoke("k", "alice", "  ")
    with pytest.raises(InvalidRequest):
        await backend.bump_epoch(1, "alice", "")
    info = await backend.inspect("k")
    assert info.last_token is None and info.holder_session is None
    assert await backend.audit_records() == []  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- grants


async def test_acquire_release_and_tokens_increase(backend: LockBackend) -> None:
    """A held key is not granted again (not even re-entrantly); after release the next token is
    higher; inspect reports holder and last token."""
    a = await backend.open_session(10)
    b = await backend.open_session(10)
    g1 = await _acquire(backend, a.session_id, "acct:1", 0)
    assert await backend.acquire(b.session_id, "acct:1", 0) == NotAcquired("acct:1", "held")
    assert await backend.acquire(a.session_id, "acct:1", 0) == NotAcquired("acct:1", "held")
    info = await backend.inspect("acct:1")
    assert (info.holder_session, info.token, info.last_token) == (a.session_id, g1.token, g1.token)
    renewed = await backend.renew(g1)
    assert renewed.token == g1.token and renewed.expires_at >= g1.expires_at
    await backend.release(g1)
    with pytest.raises(NotHeld):
        await backend.release(g1)  # a grant is released once
    g2 = await _acquire(backend, b.session_id, "acct:1", 0)
    assert g2.token > g1.token
    assert (await backend.inspect("acct:1")).last_token == g2.token


async def test_blocked_acquire_times_out(backend: LockBackend) -> None:
    """A blocked acquirer gets NotAcquired('timeout') once its budget is spent."""
    a = await backend.open_session(10)
    b = await backend.open_session(10)
    await _acquire(backend, a.session_id, "k", 0)
    assert await backend.acquire(b.session_id, "k", 0.5) == NotAcquired("k", "timeout")
    assert (await backend.inspect("k")).waiters == 0


async def test_concurrent_acquirers_are_mutually_exclusive(backend: LockBackend) -> None:
    """8 sessions x 30 rounds on one key: the recorded grant history has no overlap and strictly
    increasing tokens in grant order."""
    history: list[Held] = []

    async def worker(n: int) -> None:
        s = await backend.open_session(30)
        for _ in range(30):
            g = await _acquire(backend, s.session_id, "hot", 30)
            start = time.monotonic()
            await asyncio.sleep(random.uniform(0, 0.002))  # let the others pile up
            history.append(Held(g.token, start, time.monotonic()))
            await backend.release(g)
        await backend.close_session(s.session_id)

    await asyncio.gather(*(worker(n) for n in range(8)))
    assert len(history) == 240
    check_exclusive(history)


async def test_expiry_after_missed_heartbeats(backend: LockBackend) -> None:
    """A blocked waiter stays blocked while the holder heartbeats, also past the expiry it saw
    when it blocked; once the holder stops heartbeating (no release, no close: nothing notifies
    the waiter) its session expires on the server, the waiter acquires with a higher token, and
    the old grant can be neither renewed nor released."""
    dead = await backend.open_session(2)
    g = await _acquire(backend, dead.session_id, "k", 0)
    live = await backend.open_session(30)
    waiter = asyncio.create_task(backend.acquire(live.session_id, "k", 30))
    try:
        await _wait_until_waiting(backend, "k", waiter)
        # Heartbeat until the holder's expiry, as of when the waiter blocked, lies in the past
        # (on the backend's own clock): a waiter that trusted that expiry would now be wrong.
        renewed = g
        while renewed.expires_at < g.expires_at + timedelta(seconds=dead.ttl_s):
            await asyncio.sleep(dead.ttl_s / 5)
            renewed = await backend.renew(renewed)  # NotHeld here: the waiter took it too early
            assert not waiter.done(), f"granted while the holder is alive: {waiter.result()}"
        g2 = await waiter  # returns once the lease has expired
    finally:
        waiter.cancel()
    assert isinstance(g2, Grant), g2
    assert g2.token > g.token
    with pytest.raises(NotHeld):
        await backend.renew(g)
    with pytest.raises(NotHeld):
        await backend.release(g)
    with pytest.raises(SessionNotFound):
        await backend.keepalive(dead.session_id)
    assert (await backend.inspect("k")).holder_session == live.session_id


async def test_foreign_grant_cannot_be_released_or_renewed(backend: LockBackend) -> None:
    """Release and renew are compare-and-delete/extend on the caller's own (session, token)."""
    a = await backend.open_session(10)
    b = await backend.open_session(10)
    g = await _acquire(backend, a.session_id, "k", 0)
    forged = [
        Grant(g.key, g.token, b.session_id, g.acquired_at, g.expires_at),  # other session
        Grant(g.key, g.token + 1, a.session_id, g.acquired_at, g.expires_at),  # other token
        Grant(g.key, g.token - 1, a.session_id, g.acquired_at, g.expires_at),
        Grant("other", g.token, a.session_id, g.acquired_at, g.expires_at),  # other key
    ]
    for f in forged:
        with pytest.raises(NotHeld):
            await backend.release(f)
        with pytest.raises(NotHeld):
            await backend.renew(f)
    info = await backend.inspect("k")
    assert (info.holder_session, info.token) == (a.session_id, g.token)


async def test_force_revoke(backend: LockBackend) -> None:
    """Force-revoke ends the grant, advances the token, and writes an audit record, a
    `lock.revoked` event and an `alert`."""
    a = await backend.open_session(10)
    b = await backend.open_session(10)
    g = await _acquire(backend, a.session_id, "stuck", 0)
    with capture_logs() as logs:
        result = await backend.force_revoke("stuck", "alice", "worker wedged")
    assert (result.revoked_token, result.operator, result.reason) == (
        g.token,
        "alice",
        "worker wedged",
    )
    revoked = [e for e in logs if e["event"] == "lock.revoked"]
    alerts = [e for e in logs if e["event"] == "alert"]
    assert revoked and revoked[0]["key"] == "stuck" and revoked[0]["revoked_token"] == g.token
    assert alerts and alerts[0]["name"] == "lock_force_revoked"
    assert (alerts[0]["operator"], alerts[0]["reason"]) == ("alice", "worker wedged")
    audit = await backend.audit_records()  # type: ignore[attr-defined]
    assert [(r["action"], r["operator"], r["reason"]) for r in audit] == [
        ("force_revoke", "alice", "worker wedged")
    ]
    with pytest.raises(NotHeld):
        await backend.renew(g)
    with pytest.raises(NotHeld):
        await backend.release(g)
    g2 = await _acquire(backend, b.session_id, "stuck", 0)
    assert g2.token > g.token
    free = await backend.force_revoke("never-held", "alice", "cleanup")
    assert free.revoked_token is None


async def test_waiter_count(backend: LockBackend) -> None:
    """A session blocked in acquire counts as a waiter until it is granted."""
    a = await backend.open_session(10)
    b = await backend.open_session(10)
    g = await _acquire(backend, a.session_id, "k", 0)
    assert (await backend.inspect("k")).waiters == 0
    blocked = asyncio.create_task(backend.acquire(b.session_id, "k", 30))
    await _wait_until_waiting(backend, "k", blocked)
    await backend.release(g)
    g2 = await blocked
    assert isinstance(g2, Grant) and g2.token > g.token
    info = await backend.inspect("k")
    assert (info.waiters, info.holder_session) == (0, b.session_id)


async def test_bump_epoch_without_restore(backend: LockBackend) -> None:
    """bump_epoch raises the epoch to max(stored + 1, min_epoch), ends current grants, and the
    next token is higher."""
    a = await backend.open_session(10)
    g = await _acquire(backend, a.session_id, "k", 0)
    with capture_logs() as logs:
        assert await backend.bump_epoch(0, "alice", "drill") == 1
    assert any(e["event"] == "lock.epoch_bumped" for e in logs)
    with pytest.raises(NotHeld):
        await backend.release(g)
    assert await backend.bump_epoch(5, "alice", "drill") == 5
    g2 = await _acquire(backend, a.session_id, "k", 0)
    assert g2.token > g.token
    assert g2.token >> 40 == 5


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_no_sequence_reissues_or_lowers_a_token(
    backend_factory: BackendFactory, seed: int
) -> None:
    """A random sequence of acquires, releases, revokes, session closes, an expiry and backend
    restarts never reissues or lowers a token for a key."""
    rng = random.Random(seed)
    backend = await backend_factory()
    keys = ["a", "b"]
    issued: dict[str, list[int]] = {k: [] for k in keys}
    held: dict[str, Grant] = {}
    sessions = [(await backend.open_session(30)).session_id for _ in range(2)]
    ops = ["acquire"] * 5 + ["release", "revoke", "close", "restart"]
    plan = [rng.choice(ops) for _ in range(30)]
    plan.insert(rng.randrange(len(plan)), "expire")
    for op in plan:
        key = rng.choice(keys)
        if op == "acquire":
            got = await backend.acquire(rng.choice(sessions), key, 0)
            if isinstance(got, Grant):
                issued[key].append(got.token)
                held[key] = got
        elif op == "release" and key in held:
            await backend.release(held.pop(key))
        elif op == "revoke":
            await backend.force_revoke(key, "ops", f"seed {seed}")
            held.pop(key, None)
        elif op == "close":
            victim = rng.randrange(len(sessions))
            await backend.close_session(sessions[victim])
            held = {k: g for k, g in held.items() if g.session_id != sessions[victim]}
            sessions[victim] = (await backend.open_session(30)).session_id
        elif op == "restart":
            await backend.close()
            backend = await backend_factory()
        elif op == "expire":
            short = await backend.open_session(1)
            await backend.force_revoke(key, "ops", "make room")
            held.pop(key, None)
            issued[key].append((await _acquire(backend, short.session_id, key, 0)).token)
            await _wait_until_free(backend, key)
    for key, tokens in issued.items():
        assert tokens == sorted(set(tokens)), f"{key}: {tokens}"
        last = (await backend.inspect(key)).last_token
        assert last is None or (tokens and last == tokens[-1])


# --------------------------------------------------------------------------- real server restart


async def test_tokens_increase_across_postgres_restart(private_postgres: EmbeddedPostgres) -> None:
    """Stopping and starting the real PostgreSQL server loses no token: the next one is higher,
    and while it is down the backend reports BackendUnavailable."""
    backend = await create_backend("postgres", database_url=private_postgres.url, prefix="r/")
    try:
        s = await backend.open_session(60)
        before = []
        for _ in range(3):
            g = await _acquire(backend, s.session_id, "k", 0)
            before.append(g.token)
            await backend.release(g)
        private_postgres.stop(mode="fast")
        with pytest.raises(BackendUnavailable):
            await backend.inspect("k")
        private_postgres.start()
        g = await until_available(lambda: _acquire(backend, s.session_id, "k", 0))
        assert g.token > max(before)
    finally:
        await backend.close()


async def test_tokens_increase_across_etcd_restart(private_etcd: EmbeddedEtcd) -> None:
    """Stopping and starting the real etcd member loses no token: the next one is higher, and
    while it is down the backend reports BackendUnavailable."""
    backend = await create_backend("etcd", etcd_endpoints=private_etcd.endpoints, prefix="r/")
    try:
        s = await backend.open_session(60)
        before = []
        for _ in range(3):
            g = await _acquire(backend, s.session_id, "k", 0)
            before.append(g.token)
            await backend.release(g)
        private_etcd.stop()
        with pytest.raises(BackendUnavailable):
            await backend.inspect("k")
        private_etcd.start()
        g = await until_available(lambda: _acquire(backend, s.session_id, "k", 0))
        assert g.token > max(before)
    finally:
        await backend.close()
