"""Retention and compaction of the etcd lock backend: what keeps its keyspace and db size bounded.

Owns: the names of the grant-history keys (`P__grants/{due}/{key}/{session}-{id}`, where `due` is
a sortable UTC stamp after which the record may be pruned), the pruning of grant history and
session records older than the retention window, and the periodic MVCC compaction.

Must never: delete the record of a grant that is still valid or that ended inside the retention
window (the invariant checker needs every grant a write inside the window presented, INV-04/06/07),
touch `__lock/`, `__last/` or `__meta/epoch` (tokens are ModRevisions of the lock key; etcd's
revision counter never goes down, whatever is deleted or compacted), or compact away the
revisions a waiter's watch may still start from (it keeps at least one interval of history, and a
watch that meets a compacted revision only wakes its waiter, see `EtcdBackend._wait_for_delete`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.utils

from common.logs import get_logger
from lockservice.api import compose_token
from lockservice.server.backends import events

_log = get_logger("lockservice.etcd_retention")
#: History records read per page: each costs up to 3 reads and 3 writes, and etcd refuses a txn
#: with more than 128 operations (`--max-txn-ops`).
_PAGE = 40
#: An expired grant is dated by its session's last recorded lease deadline, which is never later
#: than etcd's own expiry but can be earlier by a round trip: records are deleted only once their
#: end is older than the window by a margin too (60 s, or 1% of a window shorter than 100 min).
_END_MARGIN_MAX = timedelta(seconds=60)
_MAX_CONFLICTS = 20
_TICK = timedelta(microseconds=1)  # the stamp's resolution: re-filed just past the cutoff
_STAMP = "%Y%m%dT%H%M%S.%f"


def stamp(at: datetime) -> str:
    """A fixed-width UTC stamp whose string order is time order (the `due` part of a name)."""
    return at.astimezone(UTC).strftime(_STAMP)


def grants_root(prefix: str) -> bytes:
    return f"{prefix}__grants/".encode()


def history_name(prefix: str, due: datetime, key: str, sid: str) -> bytes:
    return f"{prefix}__grants/{stamp(due)}/{key}/{sid}-{uuid.uuid4().hex[:12]}".encode()


def history_key_of(prefix: str, name: bytes) -> str:
    """The lock key of a history record's name (the key may itself contain '/')."""
    rest = name[len(grants_root(prefix)) :].decode()
    return rest.split("/", 1)[1].rsplit("/", 1)[0]


def ended_name(prefix: str, key: str, token: int) -> bytes:
    return f"{prefix}__ended/{key}/{token:020d}".encode()


def session_name(prefix: str, lease: int) -> bytes:
    return f"{prefix}__sessions/{lease}".encode()


def session_deadline(value: bytes) -> datetime:
    """The lease deadline a session record states (either form, see EtcdBackend._session_put)."""
    body = json.loads(value)
    return datetime.fromisoformat(body.get("valid_until") or body["expires_at"])


def retained_since_name(prefix: str) -> bytes:
    return f"{prefix}__meta/retained_since".encode()


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """`history_retention_s`: how long a grant's record is kept after it ended.
    `compact_every_s`: how often maintenance runs; each run compacts etcd to the revision seen by
    the previous run, so at least this much MVCC history is always kept."""

    history_retention_s: float
    compact_every_s: float


@dataclass(frozen=True, slots=True)
class MaintenanceRun:
    deleted: int  # grant records deleted (with their end records)
    moved: int  # grant records re-filed under a later `due` (still valid, or ended recently)
    sessions_deleted: int
    compacted_to: int | None


@dataclass(frozen=True, slots=True)
class _Decision:
    old: Any  # the history kv
    body: dict[str, Any]
    key: str
    token: int
    due: datetime | None  # None: delete; else re-file under this stamp


class EtcdMaintenance:
    """Prunes and compacts one prefix's keys; one per lock server (several servers are safe: every
    write is a compare on the record's ModRevision, and compacting below etcd's compacted revision
    is refused harmlessly)."""

    def __init__(self, client: aetcd.Client, prefix: str, policy: RetentionPolicy) -> None:
        self._c = client
        self._t = client.transactions
        self._prefix = prefix
        self._policy = policy
        self._retention = timedelta(seconds=policy.history_retention_s)
        self._margin = min(_END_MARGIN_MAX, self._retention / 100)
        self._previous_revision: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.background_runs = 0  # runs the background loop completed (tests read it)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="etcd-maintenance")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._policy.compact_every_s)
            try:
                await self.run_once()
                self.background_runs += 1
            except Exception as exc:  # e.g. etcd down: the next run catches up; never dies
                _log.warning(events.LOCK_ETCD_MAINTENANCE_FAILED, error=repr(exc))

    async def run_once(self) -> MaintenanceRun:
        """Prune what fell out of the window, then compact to the previous run's revision."""
        cutoff = datetime.now(UTC) - self._retention
        deleted, moved = await self._prune_grants(cutoff)
        sessions = await self._prune_sessions(cutoff - self._retention)
        compacted = await self._compact()
        run = MaintenanceRun(deleted, moved, sessions, compacted)
        if deleted or moved or sessions:
            _log.info(
                events.LOCK_ETCD_HISTORY_PRUNED,
                deleted=deleted,
                moved=moved,
                sessions_deleted=sessions,
                retained_since=cutoff.isoformat(),
            )
        return run

    # ------------------------------------------------------------------ grant history

    async def _range(self, start: bytes, end: bytes, limit: int) -> list[Any]:
        request = aetcd.rpc.RangeRequest(key=start, range_end=end, limit=limit)
        response = await self._c.kvstub.Range(request, timeout=5, metadata=self._c.metadata)
        return list(response.kvs)

    async def _prune_grants(self, cutoff: datetime) -> tuple[int, int]:
        root = grants_root(self._prefix)
        end = root + stamp(cutoff).encode()
        deleted = moved = conflicts = 0
        while True:
            page = await self._range(root, end, _PAGE)
            if not page:
                return deleted, moved
            if not (deleted or moved or conflicts):
                # Announce the horizon before deleting anything: a reader that reads the
                # history and then the horizon never misses a grant (lockservice.server.app).
                await self._raise_retained_since(cutoff)
            decisions = await self._decide(page, cutoff)
            if not await self._apply(decisions):
                # Another pruner (lock server) changed a record meanwhile: read the page again.
                conflicts += 1
                if conflicts > _MAX_CONFLICTS:
                    return deleted, moved  # the next run goes on
                continue
            deleted += sum(1 for d in decisions if d.due is None)
            moved += sum(1 for d in decisions if d.due is not None)

    async def _decide(self, page: list[Any], cutoff: datetime) -> list[_Decision]:
        """For each record due for pruning: when did its grant end (or is it still valid)?"""
        parsed = []
        for kv in page:
            body = json.loads(kv.value)
            key = history_key_of(self._prefix, kv.key)
            base = int(body.get("base", kv.create_revision))
            parsed.append((kv, body, key, compose_token(body["epoch"], base), base))
        reads = []
        for _, body, key, token, _ in parsed:
            reads += [
                self._t.get(ended_name(self._prefix, key, token)),
                self._t.get(f"{self._prefix}__lock/{key}".encode()),
                self._t.get(session_name(self._prefix, int(body["session_id"]))),
            ]
        _, got = await self._c.transaction(compare=[], success=reads, failure=[])
        now = datetime.now(UTC)
        out = []
        for i, (kv, body, key, token, base) in enumerate(parsed):
            ended, lock, session = got[3 * i : 3 * i + 3]
            end: datetime | None
            if ended:
                end = datetime.fromisoformat(json.loads(ended[0][0])["ended_at"])
            elif lock and lock[0][1].mod_revision == base:
                end = now  # still valid: keep it at least one more window
            elif session:
                end = session_deadline(session[0][0])
            else:  # ended unrecorded and undatable (rare race): kept one window past its start
                end = datetime.fromisoformat(body["acquired_at"]) + self._retention
            due = None if end + self._margin < cutoff else max(end, cutoff) + _TICK
            out.append(_Decision(kv, body, key, token, due))
        return out

    async def _apply(self, decisions: list[_Decision]) -> bool:
        compare, ops = [], []
        for d in decisions:
            compare.append(self._t.mod(d.old.key) == d.old.mod_revision)
            ops.append(self._t.delete(d.old.key))
            if d.due is None:
                ops.append(self._t.delete(ended_name(self._prefix, d.key, d.token)))
            else:
                # Re-filed: its create_revision changes, so the body carries the token base.
                base = int(d.body.get("base", d.old.create_revision))
                body = json.dumps({**d.body, "base": base}).encode()
                name = history_name(self._prefix, d.due, d.key, d.body["session_id"])
                ops.append(self._t.put(name, body))
        ok, _ = await self._c.transaction(compare=compare, success=ops, failure=[])
        return bool(ok)

    async def _raise_retained_since(self, cutoff: datetime) -> None:
        """Record that grants which ended before `cutoff` may be gone (never lowered; a
        concurrent raise by another server is left to win, both are before their deletions)."""
        name = retained_since_name(self._prefix)
        got = await self._c.get(name)
        if got is not None and datetime.fromisoformat(got.value.decode()) >= cutoff:
            return
        guard = self._t.create(name) == 0 if got is None else self._t.mod(name) == got.mod_revision
        await self._c.transaction(
            compare=[guard], success=[self._t.put(name, cutoff.isoformat().encode())], failure=[]
        )

    # ------------------------------------------------------------------ sessions

    async def _prune_sessions(self, before: datetime) -> int:
        """Delete session records whose lease deadline is older than `before` (two windows ago:
        every grant they could date has been pruned or dated by then)."""
        root = f"{self._prefix}__sessions/".encode()
        end, start, deleted = aetcd.utils.prefix_range_end(root), root, 0
        while True:
            page = await self._range(start, end, 500)
            if not page:
                return deleted
            old = [kv for kv in page if session_deadline(kv.value) < before]
            for kv in old:  # guarded one by one: a keepalive may have just rewritten it
                ok, _ = await self._c.transaction(
                    compare=[self._t.mod(kv.key) == kv.mod_revision],
                    success=[self._t.delete(kv.key)],
                    failure=[],
                )
                deleted += bool(ok)
            start = page[-1].key + b"\0"

    # ------------------------------------------------------------------ compaction

    async def _compact(self) -> int | None:
        """Compact to the revision the previous run saw (so one interval of history is kept)."""
        got = await self._c.get(f"{self._prefix}__meta/epoch".encode())
        current = got.header.revision if got is not None else None
        target, self._previous_revision = self._previous_revision, current
        if target is None:
            return None
        try:
            await self._c.compact(target, physical=True)
        except aetcd.exceptions.ClientError as exc:
            if "compacted" not in str(exc):
                raise
            return None  # another server compacted at least as far
        _log.info(events.LOCK_ETCD_COMPACTED, revision=target)
        return target
