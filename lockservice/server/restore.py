"""The restore procedure for the lock backends (INV-04, "the one people get wrong").

Owns: working out H, the highest token any enforcement point or the backend has seen, read-only
from where the fences are stored, and bumping the token epoch above it, audited.
Must never: let the first grant after a restore carry a token that any enforcement point has
already seen, write to an enforcement point's tables, or guess H (a source it cannot read is an
error, not a zero).

Where H comes from (every enforcement point of docs/architecture.md, "The fencing rule", and the
backend's own counters):
* the payment database (`--paydb-url`): paydb.payouts.fence, paydb.balances.fence;
* the rail proxy's database (`--railproxy-url`): railproxy.account_fences.high_token (the
  per-account high-water mark) and railproxy.attempts.token;
* the lock backend itself: `highest_token_issued()` (PostgreSQL: the counters and grant history;
  etcd: the epoch composed with the cluster revision, an upper bound).

Procedure (both backends, docs/locks-backends.md): stop the lock servers; restore the backup; run
`python -m lockservice bump-epoch --offline ...` (this module) against the backend with the lock
servers still stopped; start them. A server started on restored data before that refuses grants
(lockservice.server.watermark), so a forgotten bump shows as 503 `restore_detected`, not as a
reissue.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from lockservice.api import LockBackend, min_epoch_for, next_epoch

__all__ = ["FenceSources", "OfflineBump", "bump_after_restore", "min_epoch_for", "offline_bump"]

#: (source name, SQL returning one bigint) per enforcement point database; read-only.
_PAYDB_FENCES = (
    ("paydb.payouts.fence", "SELECT coalesce(max(fence), 0) FROM paydb.payouts"),
    ("paydb.balances.fence", "SELECT coalesce(max(fence), 0) FROM paydb.balances"),
)
_RAILPROXY_FENCES = (
    (
        "railproxy.account_fences.high_token",
        "SELECT coalesce(max(high_token), 0) FROM railproxy.account_fences",
    ),
    ("railproxy.attempts.token", "SELECT coalesce(max(token), 0) FROM railproxy.attempts"),
)


@dataclass(frozen=True)
class FenceSources:
    """Database URLs of the enforcement points (locally both are often DATABASE_URL)."""

    paydb_url: str
    railproxy_url: str


@dataclass(frozen=True)
class OfflineBump:
    highest_fence_seen: int
    #: source name -> the highest token found there
    seen: dict[str, int]
    old_epoch: int
    new_epoch: int
    applied: bool


async def _read_max(url: str, queries: tuple[tuple[str, str], ...]) -> dict[str, int]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        async with conn.transaction(readonly=True):
            return {name: int(await conn.fetchval(sql)) for name, sql in queries}
    finally:
        await conn.close()


async def read_fences(sources: FenceSources) -> dict[str, int]:
    """The highest fence stored by each enforcement point; raises if one cannot be read."""
    return {
        **await _read_max(sources.paydb_url, _PAYDB_FENCES),
        **await _read_max(sources.railproxy_url, _RAILPROXY_FENCES),
    }


async def offline_bump(
    backend: LockBackend,
    sources: FenceSources,
    *,
    operator: str,
    reason: str,
    min_epoch: int = 0,
    dry_run: bool = False,
) -> OfflineBump:
    """Compute H from every enforcement point and the backend, then (unless `dry_run`) raise the
    epoch so that every next token is > H: max(current + 1, H // 2**40 + 1, min_epoch)."""
    seen = await read_fences(sources)
    seen["lock backend"] = await backend.highest_token_issued()
    high = max(seen.values())
    current = (await backend.issuance_position()).epoch
    planned = next_epoch(current, min_epoch, high)  # the same bounds the bump applies
    if dry_run:
        return OfflineBump(high, seen, current, planned, applied=False)
    # What prevents a reissued token: every token of the new epoch is >= new * 2**40 > H, and H is
    # at least every fence stored at both enforcement points, so no grant after this bump can
    # equal (and pass as) a token an enforcement point has already accepted.
    new = await backend.bump_epoch(min_epoch, operator, reason, highest_fence_seen=high)
    return OfflineBump(high, seen, current, new, applied=True)


async def bump_after_restore(
    backend: LockBackend, *, highest_fence_seen: int, operator: str, reason: str
) -> int:
    """Raise the epoch above every token issued before the restore; returns the new epoch.

    `bump_epoch` uses max(stored + 1, min_epoch_for(H)): stored + 1 alone is enough only when no
    epoch bump happened after the backup was taken; the fence-derived minimum covers that case.
    """
    return await backend.bump_epoch(0, operator, reason, highest_fence_seen=highest_fence_seen)
