"""Restored-data detection (INV-04): an issuance watermark kept OUTSIDE the backend's data.

Owns: one small JSON file per backend location under the lock server's state dir
(`LOCK_STATE_DIR`), fsync'd before a grant leaves the server, holding the highest issuance
position this server has seen (the backend's epoch and its backend-wide issuance counter, see
`api.IssuancePosition`) and the highest token it issued.
Must never: let a grant leave the server while the backend is behind the watermark, or lower the
watermark (it only moves forward; a legitimate epoch bump moves the position forward too).

Why it works: the counter only rises while the backend lives (PostgreSQL: the grant-history
sequence; etcd: the cluster revision) and a restore from backup sets it back together with the
per-key counters/ModRevisions the tokens come from. So "position now < position recorded before"
means the data is older than what this server already issued on it, i.e. a restore without the
epoch bump (the start-up check). Every grant is also checked after the backend committed it and
before it is answered: the grant itself raised the counter after the watermark taken before it
was read, so the position read after it must be strictly above that watermark; equal or lower
means the data went back (even by a single grant). A bump to a higher epoch puts the position
above the watermark again (positions compare by epoch first), which clears the refusal.

A failover to a standby that lacked committed grants (asynchronous replication) loses grants
the same way, but PostgreSQL's sequence is WAL-logged up to 32 values ahead, so the promoted
node's counter can stand ABOVE the watermark. The mark therefore also keeps an anchor (the
highest committed grant_history id when it was read) and every check asks whether that row is
still there (`issuance_position(since=anchor)`): the table is never pruned, so a missing row
means lost data (tests/lockservice/test_failover_async.py).

Limits (docs/locks-backends.md, "Restore procedure"):
* a brand-new server (no file for this location) has nothing to compare with: it records a
  baseline and detects only restores to a point before its own later grants;
* each server knows only what it saw: run every lock server of one backend with the same state
  dir, or accept that a server that issued nothing since the backup cannot tell;
* a restore to a point after this server's last grant is not detected, and cannot hurt through
  this server (it issued nothing after that point), but other servers' tokens may repeat;
* a backend restored elsewhere (another address) gets another file: the location is the identity.
The bump stays the procedure; this only stops a forgotten one from reissuing tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from common.logs import get_logger
from lockservice.api import IssuancePosition, LockBackend, RestoreDetected

_log = get_logger("lockservice.watermark")

LOCK_RESTORE_DETECTED = "lock.restore_detected"
LOCK_RESTORE_CLEARED = "lock.restore_cleared"
LOCK_WATERMARK_BASELINE = "lock.watermark_baseline"


@dataclass(frozen=True, slots=True)
class Mark:
    epoch: int
    counter: int
    highest_token: int
    #: The backend's anchor (api.IssuancePosition.anchor) read with the position: a record of a
    #: grant that was committed then, whose absence later means lost data. 0: none (etcd, or a
    #: file written before anchors existed).
    anchor: int = 0

    def position(self) -> tuple[int, int]:
        return (self.epoch, self.counter)

    def covers(self, other: Mark) -> bool:
        return (
            self.position() >= other.position()
            and self.highest_token >= other.highest_token
            and (self.epoch, self.anchor) >= (other.epoch, other.anchor)
        )

    def merge(self, other: Mark) -> Mark:
        ahead = self if self.position() >= other.position() else other
        # Within one epoch the higher anchor (both were committed rows when read); across
        # epochs the newer epoch's (an older epoch's rows may be the ones a bump left behind).
        anchored = max(self, other, key=lambda m: (m.epoch, m.anchor))
        top = max(self.highest_token, other.highest_token)
        return Mark(ahead.epoch, ahead.counter, top, anchored.anchor)


def location_identity(
    kind: str, prefix: str, database_url: str | None, endpoints: list[str]
) -> str:
    """The backend's address, without credentials: the watermark file is per location."""
    if kind == "postgres":
        u = urlsplit(database_url or "")
        hosts = u.netloc.rpartition("@")[2]
        # every host:port of a multi-host DSN (a primary and its standby), as written
        where = hosts + u.path if "," in hosts else f"{u.hostname}:{u.port}{u.path}"
    else:
        # host:port only: the same cluster reached over TLS (`https://`) is the same location
        where = ",".join(sorted(e.rpartition("://")[2] for e in endpoints))
    return f"{kind}|{where}|prefix={prefix}"


def lost(pos: IssuancePosition, mark: Mark) -> bool:
    """True if the data lacks the grant anchored in `mark` (read with `since=mark.anchor`) and
    no epoch bump since puts every new token above the old ones: grants lost in a failover to
    a standby that never received them, even when the counter stands above the mark."""
    return pos.lost and pos.epoch <= mark.epoch


def behind(pos: IssuancePosition, mark: Mark) -> bool:
    """True if the backend's position is older than one recorded before, or lost its anchor:
    restored data, or a standby promoted without grants the old primary committed."""
    return (pos.epoch, pos.counter) < mark.position() or lost(pos, mark)


def above(pos: IssuancePosition, mark: Mark) -> bool:
    """True if the backend moved past `mark` (what a grant made after `mark` was read must do)
    and still holds the grant anchored in it."""
    return (pos.epoch, pos.counter) > mark.position() and not lost(pos, mark)


class Watermark:
    """The watermark of one backend location. Create with `Watermark.open(state_dir, identity)`."""

    def __init__(self, path: Path, identity: str, mark: Mark | None) -> None:
        self.path = path
        self.identity = identity
        self._durable = mark
        self._pending = mark
        self._lock = asyncio.Lock()
        self._blocked = False

    @classmethod
    def open(cls, state_dir: Path, identity: str) -> Watermark:
        state_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        path = state_dir / f"watermark-{digest}.json"
        mark = None
        if path.exists():
            raw = json.loads(path.read_text())
            if raw.get("identity") != identity:
                raise RuntimeError(f"{path} belongs to {raw.get('identity')!r}, not {identity!r}")
            anchor = int(raw.get("anchor", 0))  # files written before anchors existed: none
            mark = Mark(int(raw["epoch"]), int(raw["counter"]), int(raw["highest_token"]), anchor)
        return cls(path, identity, mark)

    @property
    def mark(self) -> Mark | None:
        return self._durable

    @property
    def blocked(self) -> bool:
        return self._blocked

    def _write(self, mark: Mark) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"identity": self.identity, **asdict(mark)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def _advance(self, mark: Mark) -> None:
        """Make `mark` durable (group commit: one fsync covers every grant waiting for it)."""
        self._pending = mark if self._pending is None else self._pending.merge(mark)
        async with self._lock:
            if self._durable is not None and self._durable.covers(mark):
                return
            target = self._pending
            await asyncio.to_thread(self._write, target)
            self._durable = target

    def _refuse(self, pos: IssuancePosition, mark: Mark) -> RestoreDetected:
        if not self._blocked:
            self._blocked = True
            _log.error(
                LOCK_RESTORE_DETECTED,
                backend_epoch=pos.epoch,
                backend_counter=pos.counter,
                watermark_epoch=mark.epoch,
                watermark_counter=mark.counter,
                highest_token_issued=mark.highest_token,
                anchor_lost=lost(pos, mark),
            )
        if lost(pos, mark):
            what = f"grant record {mark.anchor} is gone: a failover lost grants, or a restore"
        else:
            what = f"position {pos.epoch}/{pos.counter} < {mark.epoch}/{mark.counter}: a restore"
        return RestoreDetected(
            f"the lock backend's data is older than what this server issued ({what} without"
            " the epoch bump); run `python -m lockservice bump-epoch --offline`"
            " (docs/locks-backends.md)"
        )

    async def check(self, backend: LockBackend) -> None:
        """Start-up and before each grant while blocked: raise RestoreDetected if the backend is
        behind (or, while refusing, until its epoch is above the watermark's); otherwise record
        its position (a baseline for a brand-new watermark)."""
        floor = self._durable  # read BEFORE the position: a later read is never lower
        pos = await backend.issuance_position(since=floor.anchor if floor else 0)
        # Once refusing, only an epoch bump clears it: the refused grants themselves moved the
        # counter, so "no longer behind" proves nothing; a higher epoch puts every next token
        # above every token issued before (floor.highest_token is in an epoch <= floor.epoch).
        if floor is not None and (
            behind(pos, floor) or (self._blocked and pos.epoch <= floor.epoch)
        ):
            raise self._refuse(pos, floor)
        if self._blocked:
            self._blocked = False
            _log.warning(LOCK_RESTORE_CLEARED, backend_epoch=pos.epoch, backend_counter=pos.counter)
        if floor is None:
            _log.info(LOCK_WATERMARK_BASELINE, backend_epoch=pos.epoch, backend_counter=pos.counter)
        highest = 0 if floor is None else floor.highest_token
        await self._advance(Mark(pos.epoch, pos.counter, highest, pos.anchor))

    async def after_grant(self, backend: LockBackend, token: int, floor: Mark | None) -> None:
        """Before a grant is answered: refuse it if the backend went back, else make the position
        (which covers this grant: read after its commit) and its token durable.

        `floor` is `self.mark` taken BEFORE the grant was requested. The grant itself raised the
        counter after that mark was read, so without a restore the position is strictly above
        it; equal means the restored data reissued the increment we saw (one grant lost)."""
        pos = await backend.issuance_position(since=floor.anchor if floor else 0)
        if floor is not None and not above(pos, floor):
            raise self._refuse(pos, floor)
        await self._advance(Mark(pos.epoch, pos.counter, token, pos.anchor))
