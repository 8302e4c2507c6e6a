"""The restore procedure for the lock backends (INV-04, "the one people get wrong").

Owns: choosing the new token epoch after a backend was restored from a backup, and applying it.
Must never: let the first grant after a restore carry a token that any enforcement point has
already seen. A restored backend reissues old counters/ModRevisions; only the epoch moves the next
token above them, so the service must not take traffic between the restore and `bump`.

Procedure (both backends): stop the lock servers; restore the backup; start ONE lock server
process or run `bump_after_restore` from an operator shell with the highest fence the enforcement
points have stored (payout rows, balance rows, the rail proxy's high-water tokens); only then let
workers in.
"""

from __future__ import annotations

from lockservice.api import TOKEN_EPOCH_STRIDE, InvalidRequest, LockBackend


def min_epoch_for(highest_fence_seen: int) -> int:
    """The smallest epoch whose every token exceeds `highest_fence_seen` (0 = nothing seen)."""
    if highest_fence_seen < 0:
        raise InvalidRequest("a fence is never negative")
    return highest_fence_seen // TOKEN_EPOCH_STRIDE + 1


async def bump_after_restore(
    backend: LockBackend, *, highest_fence_seen: int, operator: str, reason: str
) -> int:
    """Raise the epoch above every token issued before the restore; returns the new epoch.

    `bump_epoch` uses max(stored + 1, min_epoch): stored + 1 alone is enough only when no epoch
    bump happened after the backup was taken; the fence-derived minimum covers that case too.
    """
    return await backend.bump_epoch(min_epoch_for(highest_fence_seen), operator, reason)
