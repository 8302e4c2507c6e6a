"""The etcd lock backend's key layout (the table in lockservice.server.backends.etcd's docstring),
the txn ops that write its durable records, and the error mapping every etcd call shares.

Owns: the names under the prefix and the shape of each record written beside a grant (its end,
the session's lease deadline, an audit record). Must never: lower a session's recorded deadline
(`session_put` compares first), or turn an etcd error into anything but BackendUnavailable or, for
a dead lease, SessionNotFound (callers fail closed, FR-27).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc

from lockservice.api import BackendUnavailable, SessionNotFound
from lockservice.server.backends import etcd_retention as retention

BACKEND = "etcd"
CAS_ATTEMPTS = 20

ETCD_ERRORS: tuple[type[BaseException], ...] = (
    aetcd.exceptions.ClientError,
    aetcd.rpc.AioRpcError,  # raw gRPC errors can escape aetcd's watch machinery
    OSError,
    TimeoutError,
)


def is_lease_not_found(exc: BaseException) -> bool:
    return "lease not found" in str(exc)


@contextlib.contextmanager
def unavailable_on_error() -> Iterator[None]:
    """Callers fail closed on BackendUnavailable (FR-27); a dead lease is SessionNotFound."""
    try:
        yield
    except ETCD_ERRORS as exc:
        if is_lease_not_found(exc):
            raise SessionNotFound("session is unknown or expired") from exc
        raise BackendUnavailable(f"etcd lock backend unreachable: {exc!r}") from exc


def lease_id(session_id: str) -> int | None:
    try:
        lease = int(session_id)
    except (ValueError, TypeError):
        return None
    return lease if 0 < lease < (1 << 63) else None


async def lease_remaining(client: aetcd.Client, lease: int) -> timedelta | None:
    info = await client.get_lease_info(lease, keys=False)
    return None if info.TTL <= 0 else timedelta(seconds=info.TTL)


class EtcdKeys:
    """The names and record writes of one prefix (`t`: the client's txn-op builder)."""

    def __init__(self, prefix: str, t: Any, replica_id: str | None) -> None:
        self.prefix = prefix
        self.t = t
        #: The lock-server replica named in every audit record (None: written by no lock server,
        #: e.g. the offline `bump-epoch`).
        self.replica_id = replica_id
        self.epoch = f"{prefix}__meta/epoch".encode()

    def lock(self, key: str) -> bytes:
        return f"{self.prefix}__lock/{key}".encode()

    def last(self, key: str) -> bytes:
        return f"{self.prefix}__last/{key}".encode()

    def waiters(self, key: str) -> bytes:
        return f"{self.prefix}__waiters/{key}|".encode()

    def history(self, key: str, sid: str, acquired_at: datetime) -> bytes:
        return retention.history_name(self.prefix, acquired_at, key, sid)

    def ended(self, key: str, token: int, reason: str) -> Any:
        """The txn op that records the end of grant `token` of `key` (no lease: durable)."""
        body = {"ended_at": datetime.now(UTC).isoformat(), "end_reason": reason}
        name = retention.ended_name(self.prefix, key, token)
        return self.t.put(name, json.dumps(body).encode())

    def session_record(self, lease: int) -> bytes:
        return retention.session_name(self.prefix, lease)

    def session_put(self, lease: int, deadline: datetime) -> Any:
        """The txn op that records the lease deadline that dates an unrecorded expiry, never
        lowering it: a lock server whose cached deadline is older than one another server
        recorded leaves that one. `valid_until` comes first and is always an ISO UTC stamp, so
        etcd's byte comparison of two records is time order (and a record of the former
        `{"ttl_s", "expires_at"}` form compares lower, so it is replaced)."""
        ttl_s = max(0.0, (deadline - datetime.now(UTC)).total_seconds())
        name = self.session_record(lease)
        record = json.dumps({"valid_until": deadline.astimezone(UTC).isoformat(), "ttl_s": ttl_s})
        put = self.t.put(name, record.encode())
        return self.t.txn(
            compare=[self.t.value(name) < record.encode()],  # false when absent: etcd's rule
            success=[put],
            failure=[self.t.txn(compare=[self.t.create(name) == 0], success=[put], failure=[])],
        )

    def audit(self, action: str, **fields: Any) -> Any:
        now = datetime.now(UTC)
        name = f"{self.prefix}__audit/{now.strftime('%Y%m%dT%H%M%S.%f')}-{uuid.uuid4().hex[:8]}"
        body = {"at": now.isoformat(), "action": action, **fields, "replica": self.replica_id}
        return self.t.put(name.encode(), json.dumps(body).encode()), now
