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

Here: the backend object, the grant path (acquire, its watch, renew, release) and the epoch
cache. Beside it, one concern each: `etcd_keys` (the layout above and the error mapping),
`etcd_sessions` (leases and their deadlines), `etcd_operators` (inspect, force-revoke, the epoch
bump, the issuance position), `etcd_history` (the grant history read back), `etcd_retention`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
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
    IssuancePosition,
    LockInfo,
    NotAcquired,
    NotHeld,
    RevokeResult,
    Session,
    SessionNotFound,
    compose_token,
    validate_key,
    validate_wait,
)
from lockservice.server.backends import etcd_retention as retention
from lockservice.server.backends import events
from lockservice.server.backends.etcd_client import EtcdTLSFiles, etcd_client
from lockservice.server.backends.etcd_history import EtcdHistory
from lockservice.server.backends.etcd_keys import (
    BACKEND,
    CAS_ATTEMPTS,
    ETCD_ERRORS,
    EtcdKeys,
    lease_id,
    lease_remaining,
    unavailable_on_error,
)
from lockservice.server.backends.etcd_operators import EtcdOperators
from lockservice.server.backends.etcd_sessions import EtcdSessions

_RPC_TIMEOUT_S = 5
#: A blocked acquirer re-arms its watch this often. The watch starts just after the holder it saw,
#: so a quiet slice misses nothing and ends without a grant attempt (each attempt is a raft
#: write; with a slice of 1 s, 1,800 waiters made 1,800 of them a second). The slice only bounds
#: how long a silently broken watch goes unnoticed.
_WATCH_SLICE_S = 5.0


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
        self._prefix = prefix
        #: The key layout; names the lock-server replica in every audit record this backend
        #: writes (None: written by no lock server, e.g. the offline `bump-epoch`).
        self._keys = EtcdKeys(prefix, client.transactions, replica_id)
        self._epoch = 0  # cached; every grant txn compares it, so a stale cache only retries
        self._operators = EtcdOperators(client, self._keys, lambda: self._epoch)
        self._history = EtcdHistory(client, self._keys)
        self._sessions = EtcdSessions(client, self._keys)
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
        with unavailable_on_error():
            await backend._c.connect()
            # Create the epoch key once, so that every grant can compare against its value.
            await backend._c.transaction(
                compare=[backend._keys.t.create(backend._keys.epoch) == 0],
                success=[backend._keys.t.put(backend._keys.epoch, b"0")],
                failure=[],
            )
            await backend._load_epoch()
        if backend.maintenance is not None:
            backend.maintenance.start()
        return backend

    # ------------------------------------------------------------------ epoch

    async def _load_epoch(self) -> int:
        got = await self._c.get(self._keys.epoch)
        self._epoch = int(got.value) if got is not None else 0
        return self._epoch

    # ------------------------------------------------------------------ sessions
    # (lockservice.server.backends.etcd_sessions)

    async def open_session(self, ttl_s: float) -> Session:
        return await self._sessions.open_session(ttl_s)

    async def keepalive(self, session_id: str) -> Session:
        return await self._sessions.keepalive(session_id)

    async def close_session(self, session_id: str) -> None:
        await self._sessions.close_session(session_id)

    # ------------------------------------------------------------------ grants

    async def acquire(self, session_id: str, key: str, wait_s: float) -> Grant | NotAcquired:
        validate_key(key)
        wait = validate_wait(wait_s)
        lease = lease_id(session_id)
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
        waiter = self._keys.waiters(key) + session_id.encode() + b"|" + uuid.uuid4().hex.encode()
        with unavailable_on_error():
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
            with contextlib.suppress(*ETCD_ERRORS):
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
                self._keys.lock(key),
                timeout=budget_s,
                start_revision=seen_rev + 1,
                kind=aetcd.rtypes.EventKind.DELETE,
            )
        except aetcd.exceptions.WatchTimeoutError:
            return False
        except ETCD_ERRORS as exc:
            got = exc
        # aetcd hands a compaction that cancels the watch over as the "event" (or raises it when
        # the watch is created on a compacted revision): either way, only a wake-up.
        if isinstance(got, aetcd.exceptions.RevisionCompactedError):
            self.compacted_watches += 1
        return True

    async def _require_session(self, lease: int) -> None:
        with unavailable_on_error():
            if await lease_remaining(self._c, lease) is None:
                raise SessionNotFound(f"session {lease} is unknown or expired")

    async def _try_acquire(self, lease: int, key: str) -> Grant | int:
        """The grant, or the revision at which the key was read held (to watch from)."""
        lock, last = self._keys.lock(key), self._keys.last(key)
        sid = str(lease)
        for _ in range(CAS_ATTEMPTS):
            epoch = self._epoch
            now = datetime.now(UTC)
            record = json.dumps({"epoch": epoch, "session_id": sid, "acquired_at": now.isoformat()})
            known_deadline = self._sessions.known_deadline(lease)
            # The grant records its session's deadline as known now, so that an expiry of this
            # grant is dated even if no keepalive comes through here while it is held.
            session = [self._keys.session_put(lease, known_deadline)] if known_deadline else []
            with unavailable_on_error():
                ok, responses = await self._c.transaction(
                    # Free key AND the epoch we compose with is current: one atomic decision.
                    compare=[
                        self._keys.t.create(lock) == 0,
                        self._keys.t.value(self._keys.epoch) == str(epoch),
                    ],
                    success=[
                        self._keys.t.put(lock, sid.encode(), lease=lease),
                        self._keys.t.put(last, record.encode()),
                        # Grant history: same txn, so every grant is recorded exactly once.
                        self._keys.t.put(self._keys.history(key, sid, now), record.encode()),
                        self._keys.t.get(lock),
                        *session,
                    ],
                    failure=[self._keys.t.get(lock), self._keys.t.get(self._keys.epoch)],
                )
            if ok:
                kv = responses[3][0][1]
                # FR-10: the token base is the ModRevision written by this very transaction.
                token = compose_token(epoch, kv.mod_revision)
                expires_at = known_deadline
                if expires_at is None:  # session kept alive elsewhere: ask etcd (one more RPC)
                    sent = datetime.now(UTC)
                    with unavailable_on_error():
                        remaining = await lease_remaining(self._c, lease) or timedelta(0)
                        expires_at = await self._sessions.remember_deadline(
                            lease, remaining.total_seconds(), sent
                        )
                events.acquired(BACKEND, key, token, sid)
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
        lease = lease_id(grant.session_id)
        ok = False
        expires_at: datetime | None = None
        if lease is not None:
            with unavailable_on_error():
                ok = await self._still_valid(grant)
                if ok:
                    sent = datetime.now(UTC)
                    reply = await self._c.refresh_lease(lease)
                    ok = reply is not None and reply.TTL > 0
                    if ok:  # held: the moved deadline is what dates this grant's expiry
                        expires_at = await self._sessions.remember_deadline(
                            lease, float(reply.TTL), sent
                        )
        if not ok or expires_at is None:
            events.renew_failed(BACKEND, grant.key, grant.token, grant.session_id)
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
            self._keys.t.value(self._keys.lock(grant.key)) == grant.session_id,
            self._keys.t.mod(self._keys.lock(grant.key)) == base,
            self._keys.t.value(self._keys.epoch) == str(epoch),
        ]

    async def _still_valid(self, grant: Grant) -> bool:
        ok, _ = await self._c.transaction(
            compare=self._grant_compare(grant), success=[], failure=[]
        )
        return bool(ok)

    async def release(self, grant: Grant) -> None:
        validate_key(grant.key)
        ok = False
        if lease_id(grant.session_id) is not None:
            with unavailable_on_error():
                # Compare-and-delete on (key, session, token) (FR-05).
                ok, _ = await self._c.transaction(
                    compare=self._grant_compare(grant),
                    success=[
                        self._keys.t.delete(self._keys.lock(grant.key)),
                        self._keys.ended(grant.key, grant.token, "released"),
                    ],
                    failure=[],
                )
        if not ok:
            raise NotHeld(f"grant {grant.token} on {grant.key!r} is no longer valid")
        events.released(BACKEND, grant.key, grant.token, grant.session_id)

    # ------------------------------------------------------------------ operators and history
    # (lockservice.server.backends.etcd_operators, etcd_history)

    async def inspect(self, key: str) -> LockInfo:
        return await self._operators.inspect(key)

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult:
        return await self._operators.force_revoke(key, operator, reason)

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        self._epoch = await self._operators.bump_epoch(
            min_epoch, operator, reason, highest_fence_seen=highest_fence_seen
        )
        return self._epoch

    async def issuance_position(self, since: int = 0) -> IssuancePosition:
        return await self._operators.issuance_position(since)

    async def highest_token_issued(self) -> int:
        return await self._operators.highest_token_issued()

    async def grant_history(
        self, key_prefix: str = "", *, limit: int | None = None
    ) -> list[GrantRecord]:
        return await self._history.grant_history(key_prefix, limit=limit)

    async def audit_records(self) -> list[dict[str, Any]]:
        return await self._history.audit_records()

    async def history_retained_since(self) -> datetime | None:
        return await self._history.history_retained_since()

    async def close(self) -> None:
        if self.maintenance is not None:
            await self.maintenance.stop()
        with contextlib.suppress(*ETCD_ERRORS):
            await asyncio.wait_for(self._c.close(), 5)
