"""The etcd lock backend's records of past grants, read back: the grant history the invariant
checker audits (INV-04/06/07), the audit records of operator actions, and the retention mark.

Owns: turning the history, end and lock keys of one consistent read into `GrantRecord`s, dating
an unrecorded end by the session's last known lease deadline, and ordering each hand-over's
timestamps by etcd's revisions. Must never: write anything (read-only), or report a grant ended
when its lock key is still the one it wrote (it is still valid).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aetcd
import aetcd.utils

from lockservice.api import GrantRecord, InvalidRequest, compose_token
from lockservice.server.backends import etcd_retention as retention
from lockservice.server.backends.etcd_keys import EtcdKeys, lease_id, unavailable_on_error


def ordered_by_revision(
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


class EtcdHistory:
    """Reads of the grant history, audit records and retention mark of one prefix."""

    def __init__(self, client: aetcd.Client, keys: EtcdKeys) -> None:
        self._c = client
        self._keys = keys

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
        roots = {n: f"{self._keys.prefix}{n}/".encode() for n in names}
        grants = retention.grants_root(self._keys.prefix)
        with unavailable_on_error():
            _, got = await self._c.transaction(
                compare=[],
                success=[
                    *(
                        self._keys.t.get(
                            r + key_prefix.encode(),
                            aetcd.utils.prefix_range_end(r + key_prefix.encode()),
                        )
                        for r in roots.values()
                    ),
                    # Filed by due time first, so the key prefix is filtered here.
                    self._keys.t.get(grants, aetcd.utils.prefix_range_end(grants)),
                ],
                failure=[],
            )
        history = [
            (kv.key[len(roots["__history"]) :].decode().rsplit("/", 1)[0], value, kv)
            for value, kv in got[0]
        ]
        for value, kv in got[3]:
            key = retention.history_key_of(self._keys.prefix, kv.key)
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
                open_lease = lease_id(body["session_id"])
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
        return ordered_by_revision(out, [(start, end) for _, _, start, end in records])

    async def _dated_by_lease(self, rec: GrantRecord, lease: int | None) -> GrantRecord:
        """An ended grant without an end record ended at its session's lease deadline, if past."""
        if lease is None:
            return rec
        with unavailable_on_error():
            got = await self._c.get(self._keys.session_record(lease))
        if got is None:
            return rec
        deadline = retention.session_deadline(got.value)
        if deadline > datetime.now(UTC):
            return rec
        return dataclasses.replace(rec, ended_at=deadline, end_reason="expired")

    async def audit_records(self) -> list[dict[str, Any]]:
        """This prefix's audit records, oldest first (operators and tests)."""
        with unavailable_on_error():
            got = await self._c.get_prefix(
                f"{self._keys.prefix}__audit/".encode(), sort_order="ascend"
            )
        return [json.loads(kv.value) for kv in got]

    async def history_retained_since(self) -> datetime | None:
        """Grants that ended before this time may have been pruned (None: nothing was)."""
        with unavailable_on_error():
            got = await self._c.get(retention.retained_since_name(self._keys.prefix))
        return datetime.fromisoformat(got.value.decode()) if got is not None else None
