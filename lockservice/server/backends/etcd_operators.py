"""The etcd lock backend's operator actions (FR-07, FR-08) and restore procedure (INV-04): inspect,
force-revoke, the epoch bump, and the issuance position the restore watermark compares.

Owns: each action's compare-and-swap against the key or epoch it changes, with its audit record
in the same txn. Must never: end a grant other than the one it read (the txn compares the lock
key's ModRevision), lower the epoch, or report a revoke or bump that etcd did not commit.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aetcd
import aetcd.utils

from lockservice.api import (
    BackendUnavailable,
    IssuancePosition,
    LockInfo,
    RevokeResult,
    compose_token,
    next_epoch,
    validate_key,
    validate_operator,
)
from lockservice.server.backends import events
from lockservice.server.backends.etcd_keys import (
    BACKEND,
    CAS_ATTEMPTS,
    ETCD_ERRORS,
    EtcdKeys,
    lease_remaining,
    unavailable_on_error,
)


class EtcdOperators:
    """Operator actions on one prefix. `epoch` reads the backend's cached epoch; the backend
    caches the one `bump_epoch` returns."""

    def __init__(self, client: aetcd.Client, keys: EtcdKeys, epoch: Callable[[], int]) -> None:
        self._c = client
        self._keys = keys
        self._epoch = epoch

    async def _read_key(self, key: str) -> tuple[Any, Any, int]:
        """(lock kv or None, last kv or None, waiter count) in one consistent read."""
        waiters = self._keys.waiters(key)
        with unavailable_on_error():
            _, responses = await self._c.transaction(
                compare=[],
                success=[
                    self._keys.t.get(self._keys.lock(key)),
                    self._keys.t.get(self._keys.last(key)),
                    self._keys.t.get(waiters, aetcd.utils.prefix_range_end(waiters)),
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
        with unavailable_on_error():
            remaining = await lease_remaining(self._c, lock.lease)
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

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult:
        validate_key(key)
        operator, reason = validate_operator(operator, reason)
        lock = self._keys.lock(key)
        for _ in range(CAS_ATTEMPTS):
            held, last, _ = await self._read_key(key)
            revoked: int | None = None
            if held is not None:
                epoch = json.loads(last.value)["epoch"] if last is not None else self._epoch()
                revoked = compose_token(epoch, held.mod_revision)
            audit, at = self._keys.audit(
                "force_revoke", key=key, operator=operator, reason=reason, revoked_token=revoked
            )
            with unavailable_on_error():
                if held is None:
                    ok, _ = await self._c.transaction(
                        compare=[self._keys.t.create(lock) == 0], success=[audit], failure=[]
                    )
                else:
                    # Deleting the key ends the grant; any later put has a higher ModRevision.
                    ok, _ = await self._c.transaction(
                        compare=[self._keys.t.mod(lock) == held.mod_revision],
                        success=[
                            self._keys.t.delete(lock),
                            audit,
                            self._keys.ended(
                                key, compose_token(epoch, held.mod_revision), "revoked"
                            ),
                        ],
                        failure=[],
                    )
            if ok:
                events.revoked(
                    BACKEND, key, revoked, operator, reason, replica=self._keys.replica_id
                )
                return RevokeResult(key, revoked, operator, reason, at)
        raise BackendUnavailable("the key kept changing while revoking; retry")

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        operator, reason = validate_operator(operator, reason)
        locks = f"{self._keys.prefix}__lock/".encode()
        for _ in range(CAS_ATTEMPTS):
            with unavailable_on_error():
                got = await self._c.get(self._keys.epoch)
                old = int(got.value) if got is not None else 0
                new = next_epoch(old, min_epoch, highest_fence_seen)  # bounded; before any write
                audit, _ = self._keys.audit(
                    "bump_epoch",
                    operator=operator,
                    reason=reason,
                    old_epoch=old,
                    new_epoch=new,
                    highest_fence_seen=highest_fence_seen,
                )
                guard = (
                    self._keys.t.mod(self._keys.epoch) == got.mod_revision
                    if got is not None
                    else self._keys.t.create(self._keys.epoch) == 0
                )
                ok, responses = await self._c.transaction(
                    compare=[guard],
                    success=[
                        self._keys.t.put(self._keys.epoch, str(new).encode()),
                        # Grants restored from a backup belong to the past: end them all.
                        self._keys.t.delete(
                            locks, aetcd.utils.prefix_range_end(locks), prev_kv=True
                        ),
                        audit,
                    ],
                    failure=[],
                )
            if ok:
                # Their history ends in a second txn (a crash in between leaves them unrecorded,
                # which grant_history reports as an unknown end). Every grant ended here was
                # composed with the old epoch: acquire compares the epoch value.
                ended = [
                    self._keys.ended(
                        kv.key[len(locks) :].decode(),
                        compose_token(old, kv.mod_revision),
                        "epoch_bumped",
                    )
                    for kv in responses[1].response_delete_range.prev_kvs
                ]
                if ended:
                    with contextlib.suppress(*ETCD_ERRORS):
                        await self._c.transaction(compare=[], success=ended, failure=[])
                events.epoch_bumped(
                    BACKEND,
                    old,
                    new,
                    operator,
                    reason,
                    highest_fence_seen=highest_fence_seen,
                    replica=self._keys.replica_id,
                )
                return new
        raise BackendUnavailable("the epoch kept changing while bumping; retry")

    async def issuance_position(self, since: int = 0) -> IssuancePosition:
        """The cluster revision: every grant txn raises it (the token base IS a revision), and a
        snapshot restore without --bump-revision sets it back to the snapshot's. It never runs
        ahead of the data (raft commits the revision with the write): no anchor, `since` unused."""
        with unavailable_on_error():
            got = await self._c.get(self._keys.epoch)
        if got is None:  # start() created it; only a restore of a pre-start snapshot lacks it
            raise BackendUnavailable("the etcd epoch key is missing; restart the lock server")
        return IssuancePosition(epoch=int(got.value), counter=int(got.header.revision))

    async def highest_token_issued(self) -> int:
        """Every ModRevision is at most the cluster revision, every epoch stored at most the
        current one: compose_token(epoch, revision) bounds every token this data can issue."""
        pos = await self.issuance_position()
        return compose_token(pos.epoch, pos.counter)
