"""The etcd lock backend's sessions: a session is an etcd lease (FR-03, FR-04), and its deadline
as last renewed here is cached and, while it holds a grant, recorded (it dates an expiry that no
end record saw).

Owns: opening, keeping alive and closing leases, the cache of lease deadlines, and ending a
closing session's grants with their end records. Must never: record a deadline later than etcd's
own (it is the time BEFORE the request + TTL), write on an idle session's heartbeat (a read and
a lease refresh only), or decide expiry itself (etcd's lease TTL does, on the server).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import aetcd

from lockservice.api import Session, SessionNotFound, compose_token, validate_ttl
from lockservice.server.backends.etcd_keys import EtcdKeys, lease_id, unavailable_on_error

MAX_CACHED_DEADLINES = 100_000


class EtcdSessions:
    """The leases of one backend and their known deadlines."""

    def __init__(self, client: aetcd.Client, keys: EtcdKeys) -> None:
        self._c = client
        self._keys = keys
        # Lease deadline per session as last renewed through this backend: the time BEFORE the
        # request + TTL, so never later than etcd's own; saves a TTL RPC on every acquire.
        self._deadlines: dict[int, datetime] = {}

    def known_deadline(self, lease: int) -> datetime | None:
        """The lease's deadline as last renewed through this backend, if cached."""
        return self._deadlines.get(lease)

    async def remember_deadline(
        self, lease: int, ttl_s: float, sent: datetime, *, persist: bool = True
    ) -> datetime:
        """Cache (and, if `persist`, record) the lease deadline known after a request sent at
        `sent`."""
        deadline = sent + timedelta(seconds=ttl_s)
        self._deadlines[lease] = deadline
        while len(self._deadlines) > MAX_CACHED_DEADLINES:  # sessions that expired silently
            del self._deadlines[next(iter(self._deadlines))]
        if persist:
            await self._c.transaction(
                compare=[], success=[self._keys.session_put(lease, deadline)], failure=[]
            )
        return deadline

    async def holds_a_grant(self, lease: int) -> bool:
        """Does the lease carry a lock key? A read: an idle session's keepalive writes nothing."""
        info = await self._c.get_lease_info(lease, keys=True)
        mine = f"{self._keys.prefix}__lock/".encode()
        return any(k.startswith(mine) for k in info.keys)

    async def open_session(self, ttl_s: float) -> Session:
        ttl = validate_ttl(ttl_s)
        sent = datetime.now(UTC)
        with unavailable_on_error():
            lease = await self._c.lease(math.ceil(ttl))
            expires_at = await self.remember_deadline(lease.id, float(lease.ttl), sent)
        return Session(session_id=str(lease.id), ttl_s=float(lease.ttl), expires_at=expires_at)

    async def keepalive(self, session_id: str) -> Session:
        lease = lease_id(session_id)
        if lease is None:
            raise SessionNotFound(f"unknown session {session_id!r}")
        sent = datetime.now(UTC)
        with unavailable_on_error():
            reply = await self._c.refresh_lease(lease)
            if reply is None or reply.TTL <= 0:
                self._deadlines.pop(lease, None)
                raise SessionNotFound(f"session {session_id} is unknown or expired")
            # The session record only dates the expiry of a grant the session holds: a
            # heartbeat of an idle session is a lease refresh and a read, never an MVCC write.
            # A grant's own txn records the deadline known then (see _try_acquire).
            expires_at = await self.remember_deadline(
                lease, float(reply.TTL), sent, persist=await self.holds_a_grant(lease)
            )
        return Session(session_id=session_id, ttl_s=float(reply.TTL), expires_at=expires_at)

    async def close_session(self, session_id: str) -> None:
        lease = lease_id(session_id)
        if lease is None:
            return
        self._deadlines.pop(lease, None)
        try:
            with unavailable_on_error():
                await self.end_session_grants(lease, session_id)
                # Revoking the lease deletes its (remaining) lock and waiter keys in one step.
                await self._c.revoke_lease(lease)
        except SessionNotFound:
            return

    async def end_session_grants(self, lease: int, sid: str) -> None:
        """Delete the session's lock keys and record their ends ('session_closed') in one txn.
        Best effort: if a grant changes meanwhile, the lease revoke still ends it, unrecorded."""
        info = await self._c.get_lease_info(lease, keys=True)
        mine = f"{self._keys.prefix}__lock/".encode()
        keys = [k[len(mine) :].decode() for k in info.keys if k.startswith(mine)]
        if not keys:
            return
        _, got = await self._c.transaction(
            compare=[],
            success=[
                op
                for k in keys
                for op in (
                    self._keys.t.get(self._keys.lock(k)),
                    self._keys.t.get(self._keys.last(k)),
                )
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
                self._keys.t.value(self._keys.lock(key)) == sid,
                self._keys.t.mod(self._keys.lock(key)) == kv.mod_revision,
            ]
            ops += [
                self._keys.t.delete(self._keys.lock(key)),
                self._keys.ended(key, token, "session_closed"),
            ]
        if ops:
            await self._c.transaction(compare=compare, success=ops, failure=[])
