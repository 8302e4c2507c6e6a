"""etcd lock backend (aetcd): a session is a lease; a grant is a key attached to it.

Owns every key under its prefix. Must never: issue a token that is not the ModRevision of the
lock key written by the granting transaction (FR-10), grant a key that exists (INV-06), or keep a
grant alive past its lease (expiry is etcd's lease TTL, on the server).

Key layout (`P` = prefix; `|` cannot occur in a lock key, so waiter ranges never overlap):
  P__lock/{key}            value = session id, lease = session     (the grant; absent = free)
  P__last/{key}            JSON {epoch, session_id, acquired_at}   (written in the same txn, so its
                           ModRevision is the last token base; never leased, never deleted)
  P__waiters/{key}|{sid}   lease = session                         (inspect().waiters)
  P__meta/epoch            decimal epoch                           (bumped by the restore procedure)
  P__audit/{ts}-{uuid}     JSON audit record of force_revoke / bump_epoch
  P__grants/{due}/{key}/{sid}-{uuid}  JSON {epoch, session_id, acquired_at[, base]}: one per
                           grant, written in the acquire txn, never leased: its create_revision IS
                           the token base (the name cannot carry the token: the revision is known
                           only after); `due` (its start) sorts by time, so retention finds what
                           fell out of the window without a scan (etcd_retention; a re-filed record
                           carries `base`)
  P__history/{key}/...     the same, as written before retention existed: read, never pruned
  P__ended/{key}/{token:020d}  JSON {ended_at, end_reason}: written in the release / revoke /
                           close / bump txn that ends the grant
  P__sessions/{lease}      JSON {valid_until, ttl_s}: the lease deadline (never lowered) as of
                           the last open, grant, or keepalive while holding a grant, through a
                           lock server (never leased: it dates an unrecorded expiry; pruned two
                           windows after it)
  P__meta/retained_since   ISO time: grants that ended before it may have been pruned
The epoch lives in etcd and is restored with a snapshot: the restore procedure (bump_epoch with
min_epoch from the enforcement points' fences) is what moves tokens above the pre-restore ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.rtypes
import aetcd.utils

from lockservice.api import (
    TOKEN_EPOCH_STRIDE,
    BackendUnavailable,
    Grant,
    GrantRecord,
    InvalidRequest,
    IssuancePosition,
    LockInfo,
    NotAcquired,
    NotHeld,
    RevokeResult,
    Session,
    SessionNotFound,
    compose_token,
    next_epoch,
    validate_key,
    validate_operator,
    validate_ttl,
    validate_wait,
)
from lockservice.server.backends import etcd_retention as retention
from lockservice.server.backends import events
from lockservice.server.backends.etcd_client import EtcdTLSFiles, etcd_client

_BACKEND = "etcd"
_RPC_TIMEOUT_S = 5
#: A blocked acquirer re-arms its watch this often. The watch starts just after the holder it saw,
#: so a quiet slice misses nothing and ends without a grant attempt (each attempt is a raft
#: write; with a slice of 1 s, 1,800 waiters made 1,800 of them a second). The slice only bounds
#: how long a silently broken watch goes unnoticed.
_WATCH_SLICE_S = 5.0
_CAS_ATTEMPTS = 20
_MAX_CACHED_DEADLINES = 100_000

_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.exceptions.ClientError,
    aetcd.rpc.AioRpcError,  # raw gRPC errors can escape aetcd's watch machinery
    OSError,
    TimeoutError,
)


def _is_lease_not_found(exc: BaseException) -> bool:
    return "lease not found" in str(exc)


@contextlib.contextmanager
def _unavailable_on_error() -> Iterator[None]:
    """Callers fail closed on BackendUnavailable (FR-27); a dead lease is SessionNotFound."""
    try:
        yield
    except _ERRORS as exc:
        if _is_lease_not_found(exc):
            raise SessionNotFound("session is unknown or expired") from exc
        raise BackendUnavailable(f"etcd lock backend unreachable: {exc!r}") from exc


def _lease_id(session_id: str) -> int | None:
    try:
        lease = int(session_id)
    except (ValueError, TypeError):
        return None
    return lease if 0 < lease < (1 << 63) else None


def _ordered_by_revision(
    recs: list[GrantRecord], revisions: list[tuple[int, int | None]]
) -> list[GrantRecord]:
    """Make each hand-over's timestamps agree with etcd's revision order, which is exact.

    Both stamps are the lock server's clock read just BEFORE the txn that starts or ends a grant,
    so the next grant's start stamp can precede the previous grant's end stamp by up to one round
    trip although etcd applied the end first. The revisions decide: if the previous grant's end
    record was written before the next grant's start (end revision < start revision), the next
    start is reported no earlier than 1 us after the previous end; if it was written AFTER (a real
    overlap), the next start is reported 1 us before the previous end, so that the invariant
    checker sees the overlap instead of a lucky clock."""
    out = list(recs)
    for i in range(1, len(out)):
        prev, cur = out[i - 1], out[i]
        prev_end_rev = revisions[i - 1][1]
        if prev.key != cur.key or prev.ended_at is None or prev_end_rev is None:
            continue
        tick = timedelta(microseconds=1)
        if prev_end_rev < revisions[i][0]:
            start = max(cur.acquired_at, prev.ended_at + tick)
        else:
            start = min(cur.acquired_at, prev.ended_at - tick)
        out[i] = dataclasses.replace(cur, acquired_at=start)
    return out


class EtcdBackend:
    """LockBackend over an etcd cluster. Create with `await EtcdBackend.start(...)`."""

    def __init__(
        self,
        client: aetcd.Client,
        prefix: str,
        policy: retention.RetentionPolicy | None = None,
        *,
        replica_id: str | None = None,
    ) -> None:
        self._c = client
        self._t = client.transactions
        self._prefix = prefix
        #: The lock-server replica named in every audit record this backend writes (None:
        #: written by no lock server, e.g. the offline `bump-epoch`).
        self._replica_id = replica_id
        self._epoch_key = f"{prefix}__meta/epoch".encode()
        self._epoch = 0  # cached; every grant txn compares it, so a stale cache only retries
        # Lease deadline per session as last renewed through this backend: the time BEFORE the
        # request + TTL, so never later than etcd's own; saves a TTL RPC on every acquire.
        self._deadlines: dict[int, datetime] = {}
        self.maintenance = (
            retention.EtcdMaintenance(client, prefix, policy) if policy is not None else None
        )
        #: Watches that met a compacted revision (each only woke its waiter); tests read it.
        self.compacted_watches = 0

    @classmethod
    async def start(
        cls,
        endpoints: list[str],
        prefix: str = "",
        policy: retention.RetentionPolicy | None = None,
        tls: EtcdTLSFiles | None = None,
        *,
        replica_id: str | None = None,
    ) -> EtcdBackend:
        """Connect (over mutual TLS for `https://` endpoints, with `tls`); with a `policy`, also
        run retention and compaction in the background."""
        client = etcd_client(endpoints, tls, timeout=_RPC_TIMEOUT_S)
        backend = cls(client, prefix, policy, replica_id=replica_id)
        with _unavailable_on_error():
            await backend._c.connect()
            # Create the epoch key once, so that every grant can compare against its value.
            await backend._c.transaction(
                compare=[backend._t.create(backend._epoch_key) == 0],
                success=[backend._t.put(backend._epoch_key, b"0")],
                failure=[],
            )
            await backend._load_epoch()
        if backend.maintenance is not None:
            backend.maintenance.start()
        return backend

    # ------------------------------------------------------------------ keys

    def _lock(self, key: str) -> bytes:
        return f"{self._prefix}__lock/{key}".encode()

    def _last(self, key: str) -> bytes:
        return f"{self._prefix}__last/{key}".encode()

    def _waiters(self, key: str) -> bytes:
        return f"{self._prefix}__waiters/{key}|".encode()

    def _history(self, key: str, sid: str, acquired_at: datetime) -> bytes:
        return retention.history_name(self._prefix, acquired_at, key, sid)

    def _ended(self, key: str, token: int, reason: str) -> Any:
        """The txn op that records the end of grant `token` of `key` (no lease: durable)."""
        body = {"ended_at": datetime.now(UTC).isoformat(), "end_reason": reason}
        name = retention.ended_name(self._prefix, key, token)
        return self._t.put(name, json.dumps(body).encode())

    def _session_record(self, lease: int) -> bytes:
        return retention.session_name(self._prefix, lease)

    def _session_put(self, lease: int, deadline: datetime) -> Any:
        """The txn op that records the lease deadline that dates an unrecorded expiry, never
        lowering it: a lock server whose cached deadline is older than one another server
        recorded leaves that one. `valid_until` comes first and is always an ISO UTC stamp, so
        etcd's byte comparison of two records is time order (and a record of the former
        `{"ttl_s", "expires_at"}` form compares lower, so it is replaced)."""
        ttl_s = max(0.0, (deadline - datetime.now(UTC)).total_seconds())
        name = self._session_record(lease)
        record = json.dumps({"valid_until": deadline.astimezone(UTC).isoformat(), "ttl_s": ttl_s})
        put = self._t.put(name, record.encode())
        return self._t.txn(
            compare=[self._t.value(name) < record.encode()],  # false when absent: etcd's rule
            success=[put],
            failure=[self._t.txn(compare=[self._t.create(name) == 0], success=[put], failure=[])],
        )

    async def _remember_deadline(
        self, lease: int, ttl_s: float, sent: datetime, *, persist: bool = True
    ) -> datetime:
        """Cache (and, if `persist`, record) the lease deadline known after a request sent at
        `sent`."""
        deadline = sent + timedelta(seconds=ttl_s)
        self._deadlines[lease] = deadline
        while len(self._deadlines) > _MAX_CACHED_DEADLINES:  # sessions that expired silently
            del self._deadlines[next(iter(self._deadlines))]
        if persist:
            await self._c.transaction(
                compare=[], success=[self._session_put(lease, deadline)], failure=[]
            )
        return deadline

    async def _holds_a_grant(self, lease: int) -> bool:
        """Does the lease carry a lock key? A read: an idle session's keepalive writes nothing."""
        info = await self._c.get_lease_info(lease, keys=True)
        mine = f"{self._prefix}__lock/".encode()
        return any(k.startswith(mine) for k in info.keys)

    async def _load_epoch(self) -> int:
        got = await self._c.get(self._epoch_key)
        self._epoch = int(got.value) if got is not None else 0
        return self._epoch

    async def _remaining(self, lease: int) -> timedelta | None:
        info = await self._c.get_lease_info(lease, keys=False)
        return None if info.TTL <= 0 else timedelta(seconds=info.TTL)

    # ------------------------------------------------------------------ sessions

    async def open_session(self, ttl_s: float) -> Session:
        ttl = validate_ttl(ttl_s)
        sent = datetime.now(UTC)
        with _unavailable_on_error():
            lease = await self._c.lease(math.ceil(ttl))
            expires_at = await self._remember_deadline(lease.id, float(lease.ttl), sent)
        return Session(session_id=str(lease.id), ttl_s=float(lease.ttl), expires_at=expires_at)

    async def keepalive(self, session_id: str) -> Session:
        lease = _lease_id(session_id)
        if lease is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        sent = datetime.now(UTC)
        with _unavailable_on_error():
            reply = await self._c.refresh_lease(lease)
            if reply is None or reply.TTL <= 0:
                self._deadlines.pop(lease, None)
                raise SessionNotFound(f"session {session_id} is unknown or expired")
            # The session record only dates the expiry of a grant the session holds: a
            # heartbeat of an idle session is a lease refresh and a read, never an MVCC write.
            # A grant's own txn records the deadline known then (see _try_acquire).
            expires_at = await self._remember_deadline(
                lease, float(reply.TTL), sent, persist=await self._holds_a_grant(lease)
            )
        return Session(session_id=session_id, ttl_s=float(reply.TTL), expires_at=expires_at)

    async def close_session(self, session_id: str) -> None:
        lease = _lease_id(session_id)
        if lease is None:
            return
        self._deadlines.pop(lease, None)
        try:
            with _unavailable_on_error():
                await self._end_session_grants(lease, session_id)
                # Revoking the lease deletes its (remaining) lock and waiter keys in one step.
                await self._c.revoke_lease(lease)
        except SessionNotFound:
            return

    async def _end_session_grants(self, lease: int, sid: str) -> None:
        """Delete the session's lock keys and record their ends ('session_closed') in one txn.
        Best effort: if a grant changes meanwhile, the lease revoke still ends it, unrecorded."""
        info = await self._c.get_lease_info(lease, keys=True)
        mine = f"{self._prefix}__lock/".encode()
        keys = [k[len(mine) :].decode() for k in info.keys if k.startswith(mine)]
        if not keys:
            return
        _, got = await self._c.transaction(
            compare=[],
            success=[
                op for k in keys for op in (self._t.get(self._lock(k)), self._t.get(self._last(k)))
            ],
            failure=[],
        )
        compare, ops = [], []
        for i, key in enumerate(keys):
            lock, last = got[2 * i], got[2 * i + 1]
            if not lock or not last or lock[0][1].mod_revision != last[0][1].mod_revision:
                continue
            kv = lock[0][1]
            token = compose_token(json.loads(last[0][0])["epoch"], kv.mod_revision)
            compare += [
                self._t.value(self._lock(key)) == sid,
                self._t.mod(self._lock(key)) == kv.mod_revision,
            ]
            ops += [self._t.delete(self._lock(key)), self._ended(key, token, "session_closed")]
        if ops:
            await self._c.transaction(compare=compare, success=ops, failure=[])

    # ------------------------------------------------------------------ grants

    async def acquire(self, session_id: str, key: str, wait_s: float) -> Grant | NotAcquired:
        validate_key(key)
        wait = validate_wait(wait_s)
        lease = _lease_id(session_id)
        if lease is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        first = await self._try_acquire(lease, key)
        if isinstance(first, Grant):
            return first
        seen_rev = first
        if wait == 0:
            await self._require_session(lease)
            return NotAcquired(key=key, reason="held")
        waiter = self._waiters(key) + session_id.encode() + b"|" + uuid.uuid4().hex.encode()
        with _unavailable_on_error():
            await self._c.put(waiter, b"", lease=lease)  # dies with the session
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return NotAcquired(key=key, reason="timeout")
                if not await self._wait_for_delete(key, seen_rev, min(remaining, _WATCH_SLICE_S)):
                    continue  # the holder we saw still holds it
                attempt = await self._try_acquire(lease, key)
                if isinstance(attempt, Grant):
                    return attempt
                seen_rev = attempt
        finally:
            with contextlib.suppress(*_ERRORS):
                await self._c.delete(waiter)

    async def _wait_for_delete(self, key: str, seen_rev: int, budget_s: float) -> bool:
        """Watch the lock key from just after the revision at which we saw it held. True when
        it may be free now: a DELETE came (release, revoke, lease expiry), or the watch failed,
        which is only a wake-up. False when the budget ran out quietly: that holder still holds
        the key.

        Compaction (etcd_retention) may remove `seen_rev + 1` while a long hold is watched: the
        watch then fails with RevisionCompactedError, which wakes the waiter; its next attempt
        reads the key again and returns a fresh revision to watch from, so it never spins on a
        compacted one and never misses a DELETE (none happened up to the revision it read)."""
        try:
            got = await self._c.watch_once(
                self._lock(key),
                timeout=budget_s,
                start_revision=seen_rev + 1,
                kind=aetcd.rtypes.EventKind.DELETE,
            )
        except aetcd.exceptions.WatchTimeoutError:
            return False
        except _ERRORS as exc:
            got = exc
        # aetcd hands a compaction that cancels the watch over as the "event" (or raises it when
        # the watch is created on a compacted revision): either way, only a wake-up.
        if isinstance(got, aetcd.exceptions.RevisionCompactedError):
            self.compacted_watches += 1
        return True

    async def _require_session(self, lease: int) -> None:
        with _unavailable_on_error():
            if await self._remaining(lease) is None:
                raise SessionNotFound(f"session {lease} is unknown or expired")

    async def _try_acquire(self, lease: int, key: str) -> Grant | int:
        """The grant, or the revision at which the key was read held (to watch from)."""
        lock, last = self._lock(key), self._last(key)
        sid = str(lease)
        for _ in range(_CAS_ATTEMPTS):
            epoch = self._epoch
            now = datetime.now(UTC)
            record = json.dumps({"epoch": epoch, "session_id": sid, "acquired_at": now.isoformat()})
            known_deadline = self._deadlines.get(lease)
            # The grant records its session's deadline as known now, so that an expiry of this
            # grant is dated even if no keepalive comes through here while it is held.
            session = [self._session_put(lease, known_deadline)] if known_deadline else []
            with _unavailable_on_error():
                ok, responses = await self._c.transaction(
                    # Free key AND the epoch we compose with is current: one atomic decision.
                    compare=[
                        self._t.create(lock) == 0,
                        self._t.value(self._epoch_key) == str(epoch),
                    ],
                    success=[
                        self._t.put(lock, sid.encode(), lease=lease),
                        self._t.put(last, record.encode()),
                        # Grant history: same txn, so every grant is recorded exactly once.
                        self._t.put(self._history(key, sid, now), record.encode()),
                        self._t.get(lock),
                        *session,
                    ],
                    failure=[self._t.get(lock), self._t.get(self._epoch_key)],
                )
            if ok:
                kv = responses[3][0][1]
                # FR-10: the token base is the ModRevision written by this very transaction.
                token = compose_token(epoch, kv.mod_revision)
                expires_at = known_deadline
                if expires_at is None:  # session kept alive elsewhere: ask etcd (one more RPC)
                    sent = datetime.now(UTC)
                    with _unavailable_on_error():
                        remaining = await self._remaining(lease) or timedelta(0)
                        expires_at = await self._remember_deadline(
                            lease, remaining.total_seconds(), sent
                        )
                events.acquired(_BACKEND, key, token, sid)
                return Grant(
                    key=key, token=token, session_id=sid, acquired_at=now, expires_at=expires_at
                )
            holder, epoch_kv = responses[0], responses[1]
            if epoch_kv:
                self._epoch = int(epoch_kv[0][0])
            if holder:
                # Held (also by this very session: no re-entrancy, DR-04). Watch from the
                # revision of this read: recent, so not compacted, and no DELETE came before it.
                return int(holder[0][1].header.revision)
        raise BackendUnavailable("the epoch kept changing while acquiring; retry")

    async def renew(self, grant: Grant) -> Grant:
        validate_key(grant.key)
        lease = _lease_id(grant.session_id)
        ok = False
        expires_at: datetime | None = None
        if lease is not None:
            with _unavailable_on_error():
                ok = await self._still_valid(grant)
                if ok:
                    sent = datetime.now(UTC)
                    reply = await self._c.refresh_lease(lease)
                    ok = reply is not None and reply.TTL > 0
                    if ok:  # held: the moved deadline is what dates this grant's expiry
                        expires_at = await self._remember_deadline(lease, float(reply.TTL), sent)
        if not ok or expires_at is None:
            events.renew_failed(_BACKEND, grant.key, grant.token, grant.session_id)
            raise NotHeld(f"grant {grant.token} on {grant.key!r} is no longer valid")
        return Grant(
            key=grant.key,
            token=grant.token,
            session_id=grant.session_id,
            acquired_at=grant.acquired_at,
            expires_at=expires_at,
        )

    def _grant_compare(self, grant: Grant) -> list[Any]:
        epoch, base = divmod(grant.token, TOKEN_EPOCH_STRIDE)
        return [
            self._t.value(self._lock(grant.key)) == grant.session_id,
            self._t.mod(self._lock(grant.key)) == base,
            self._t.value(self._epoch_key) == str(epoch),
        ]

    async def _still_valid(self, grant: Grant) -> bool:
        ok, _ = await self._c.transaction(
            compare=self._grant_compare(grant), success=[], failure=[]
        )
        return bool(ok)

    async def release(self, grant: Grant) -> None:
        validate_key(grant.key)
        ok = False
        if _lease_id(grant.session_id) is not None:
            with _unavailable_on_error():
                # Compare-and-delete on (key, session, token) (FR-05).
                ok, _ = await self._c.transaction(
                    compare=self._grant_compare(grant),
                    success=[
                        self._t.delete(self._lock(grant.key)),
                        self._ended(grant.key, grant.token, "released"),
                    ],
                    failure=[],
                )
        if not ok:
            raise NotHeld(f"grant {grant.token} on {grant.key!r} is no longer valid")
        events.released(_BACKEND, grant.key, grant.token, grant.session_id)

    # ------------------------------------------------------------------ operators

    async def _read_key(self, key: str) -> tuple[Any, Any, int]:
        """(lock kv or None, last kv or None, waiter count) in one consistent read."""
        waiters = self._waiters(key)
        with _unavailable_on_error():
            _, responses = await self._c.transaction(
                compare=[],
                success=[
                    self._t.get(self._lock(key)),
                    self._t.get(self._last(key)),
                    self._t.get(waiters, aetcd.utils.prefix_range_end(waiters)),
                ],
                failure=[],
            )
        lock = responses[0][0][1] if responses[0] else None
        last = responses[1][0][1] if responses[1] else None
        # Waiter keys are `...{key}|{session}|{uuid}`: count distinct sessions.
        sessions = {kv.key[len(waiters) :].split(b"|", 1)[0] for _, kv in responses[2]}
        return lock, last, len(sessions)

    async def inspect(self, key: str) -> LockInfo:
        validate_key(key)
        lock, last, waiters = await self._read_key(key)
        record = json.loads(last.value) if last is not None else None
        last_token = compose_token(record["epoch"], last.mod_revision) if record else None
        if lock is None or record is None or last.mod_revision != lock.mod_revision:
            return LockInfo(key, None, None, None, None, waiters, last_token)
        with _unavailable_on_error():
            remaining = await self._remaining(lock.lease)
        if remaining is None:  # lease expired, key not yet reaped by etcd
            return LockInfo(key, None, None, None, None, waiters, last_token)
        return LockInfo(
            key=key,
            holder_session=lock.value.decode(),
            token=last_token,
            acquired_at=datetime.fromisoformat(record["acquired_at"]),
            expires_at=datetime.now(UTC) + remaining,
            waiters=waiters,
            last_token=last_token,
        )

    def _audit(self, action: str, **fields: Any) -> Any:
        now = datetime.now(UTC)
        name = f"{self._prefix}__audit/{now.strftime('%Y%m%dT%H%M%S.%f')}-{uuid.uuid4().hex[:8]}"
        body = {"at": now.isoformat(), "action": action, **fields, "replica": self._replica_id}
        return self._t.put(name.encode(), json.dumps(body).encode()), now

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult:
        validate_key(key)
        operator, reason = validate_operator(operator, reason)
        lock = self._lock(key)
        for _ in range(_CAS_ATTEMPTS):
            held, last, _ = await self._read_key(key)
            revoked: int | None = None
            if held is not None:
                epoch = json.loads(last.value)["epoch"] if last is not None else self._epoch
                revoked = compose_token(epoch, held.mod_revision)
            audit, at = self._audit(
                "force_revoke", key=key, operator=operator, reason=reason, revoked_token=revoked
            )
            with _unavailable_on_error():
                if held is None:
                    ok, _ = await self._c.transaction(
                        compare=[self._t.create(lock) == 0], success=[audit], failure=[]
                    )
                else:
                    # Deleting the key ends the grant; any later put has a higher ModRevision.
                    ok, _ = await self._c.transaction(
                        compare=[self._t.mod(lock) == held.mod_revision],
                        success=[
                            self._t.delete(lock),
                            audit,
                            self._ended(key, compose_token(epoch, held.mod_revision), "revoked"),
                        ],
                        failure=[],
                    )
            if ok:
                events.revoked(_BACKEND, key, revoked, operator, reason, replica=self._replica_id)
                return RevokeResult(key, revoked, operator, reason, at)
        raise BackendUnavailable("the key kept changing while revoking; retry")

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        operator, reason = validate_operator(operator, reason)
        locks = f"{self._prefix}__lock/".encode()
        for _ in range(_CAS_ATTEMPTS):
            with _unavailable_on_error():
                got = await self._c.get(self._epoch_key)
                old = int(got.value) if got is not None else 0
                new = next_epoch(old, min_epoch, highest_fence_seen)  # bounded; before any write
                audit, _ = self._audit(
                    "bump_epoch",
                    operator=operator,
                    reason=reason,
                    old_epoch=old,
                    new_epoch=new,
                    highest_fence_seen=highest_fence_seen,
                )
                guard = (
                    self._t.mod(self._epoch_key) == got.mod_revision
                    if got is not None
                    else self._t.create(self._epoch_key) == 0
                )
                ok, responses = await self._c.transaction(
                    compare=[guard],
                    success=[
                        self._t.put(self._epoch_key, str(new).encode()),
                        # Grants restored from a backup belong to the past: end them all.
                        self._t.delete(locks, aetcd.utils.prefix_range_end(locks), prev_kv=True),
                        audit,
                    ],
                    failure=[],
                )
            if ok:
                # Their history ends in a second txn (a crash in between leaves them unrecorded,
                # which grant_history reports as an unknown end). Every grant ended here was
                # composed with the old epoch: acquire compares the epoch value.
                ended = [
                    self._ended(
                        kv.key[len(locks) :].decode(),
                        compose_token(old, kv.mod_revision),
                        "epoch_bumped",
                    )
                    for kv in responses[1].response_delete_range.prev_kvs
                ]
                if ended:
                    with contextlib.suppress(*_ERRORS):
                        await self._c.transaction(compare=[], success=ended, failure=[])
                self._epoch = new
                events.epoch_bumped(
                    _BACKEND,
                    old,
                    new,
                    operator,
                    reason,
                    highest_fence_seen=highest_fence_seen,
                    replica=self._replica_id,
                )
                return new
        raise BackendUnavailable("the epoch kept changing while bumping; retry")

    async def issuance_position(self, since: int = 0) -> IssuancePosition:
        """The cluster revision: every grant txn raises it (the token base IS a revision), and a
        snapshot restore without --bump-revision sets it back to the snapshot's. It never runs
        ahead of the data (raft commits the revision with the write): no anchor, `since` unused."""
        with _unavailable_on_error():
            got = await self._c.get(self._epoch_key)
        if got is None:  # start() created it; only a restore of a pre-start snapshot lacks it
            raise BackendUnavailable("the etcd epoch key is missing; restart the lock server")
        return IssuancePosition(epoch=int(got.value), counter=int(got.header.revision))

    async def highest_token_issued(self) -> int:
        """Every ModRevision is at most the cluster revision, every epoch stored at most the
        current one: compose_token(epoch, revision) bounds every token this data can issue."""
        pos = await self.issuance_position()
        return compose_token(pos.epoch, pos.counter)

    async def grant_history(
        self, key_prefix: str = "", *, limit: int | None = None
    ) -> list[GrantRecord]:
        """Every grant of this prefix, ordered by (key, token), from one consistent read.

        A grant without an end record is still valid if its lock key is still the one it wrote;
        otherwise its end went unrecorded (lease expiry, or a rare race with close/bump): it is
        reported ended at its session's last known lease deadline ('expired') when that lies in
        the past, else with an unknown end (None, None).
        """
        if limit is not None and limit < 0:
            raise InvalidRequest("limit must not be negative")
        names = ("__history", "__ended", "__lock")
        roots = {n: f"{self._prefix}{n}/".encode() for n in names}
        grants = retention.grants_root(self._prefix)
        with _unavailable_on_error():
            _, got = await self._c.transaction(
                compare=[],
                success=[
                    *(
                        self._t.get(
                            r + key_prefix.encode(),
                            aetcd.utils.prefix_range_end(r + key_prefix.encode()),
                        )
                        for r in roots.values()
                    ),
                    # Filed by due time first, so the key prefix is filtered here.
                    self._t.get(grants, aetcd.utils.prefix_range_end(grants)),
                ],
                failure=[],
            )
        history = [
            (kv.key[len(roots["__history"]) :].decode().rsplit("/", 1)[0], value, kv)
            for value, kv in got[0]
        ]
        for value, kv in got[3]:
            key = retention.history_key_of(self._prefix, kv.key)
            if key.startswith(key_prefix):
                history.append((key, value, kv))
        ended: dict[tuple[str, int], dict[str, Any]] = {}
        for value, kv in got[1]:
            key, token = kv.key[len(roots["__ended"]) :].decode().rsplit("/", 1)
            ended[(key, int(token))] = {**json.loads(value), "revision": kv.create_revision}
        current = {kv.key[len(roots["__lock"]) :].decode(): kv.mod_revision for _, kv in got[2]}
        records: list[tuple[GrantRecord, int | None, int, int | None]] = []
        for key, value, kv in history:
            body = json.loads(value)
            # The history key is written once, by the granting txn: its create_revision is the
            # lock key's ModRevision, i.e. the token base (FR-10). A record re-filed by
            # retention carries that base in its body.
            base = int(body.get("base", kv.create_revision))
            token = compose_token(body["epoch"], base)
            end = ended.get((key, token))
            open_lease: int | None = None
            if end is None and current.get(key) != base:
                open_lease = _lease_id(body["session_id"])
            records.append(
                (
                    GrantRecord(
                        key=key,
                        token=token,
                        session_id=body["session_id"],
                        acquired_at=datetime.fromisoformat(body["acquired_at"]),
                        ended_at=datetime.fromisoformat(end["ended_at"]) if end else None,
                        end_reason=end["end_reason"] if end else None,
                    ),
                    open_lease,
                    base,
                    end["revision"] if end else None,
                )
            )
        records.sort(key=lambda r: (r[0].key, r[0].token))
        if limit is not None:
            records = records[:limit]
        out = [await self._dated_by_lease(rec, lease) for rec, lease, _, _ in records]
        return _ordered_by_revision(out, [(start, end) for _, _, start, end in records])

    async def _dated_by_lease(self, rec: GrantRecord, lease: int | None) -> GrantRecord:
        """An ended grant without an end record ended at its session's lease deadline, if past."""
        if lease is None:
            return rec
        with _unavailable_on_error():
            got = await self._c.get(self._session_record(lease))
        if got is None:
            return rec
        deadline = retention.session_deadline(got.value)
        if deadline > datetime.now(UTC):
            return rec
        return dataclasses.replace(rec, ended_at=deadline, end_reason="expired")

    async def audit_records(self) -> list[dict[str, Any]]:
        """This prefix's audit records, oldest first (operators and tests)."""
        with _unavailable_on_error():
            got = await self._c.get_prefix(f"{self._prefix}__audit/".encode(), sort_order="ascend")
        return [json.loads(kv.value) for kv in got]

    async def history_retained_since(self) -> datetime | None:
        """Grants that ended before this time may have been pruned (None: nothing was)."""
        with _unavailable_on_error():
            got = await self._c.get(retention.retained_since_name(self._prefix))
        return datetime.fromisoformat(got.value.decode()) if got is not None else None

    async def close(self) -> None:
        if self.maintenance is not None:
            await self.maintenance.stop()
        with contextlib.suppress(*_ERRORS):
            await asyncio.wait_for(self._c.close(), 5)
