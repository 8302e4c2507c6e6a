"""Grant verification glue (INV-07): a fenced write must present the lock service's signed grant
of the payout's account key for its token, checked before the transaction writes anything (the
signature and token before its first statement; the key by that statement's own condition, which
stamps nothing for a grant of another key, and by `check_account` after it).

`GrantCheck` is owned by the fenced writer (`ledger.store.fenced`), which calls it first in every
fenced transaction; nothing else in the store checks grants.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from common.lockkey import PAYOUT_KEY_PREFIX, lock_key
from ledger import metrics
from ledger.errors import FencedOut, InvalidGrant
from ledger.store.base import GrantLike, log
from lockservice.verifiers import (
    GrantError,
    GrantExpired,
    GrantVerifier,
    SignedGrant,
    check_key,
    is_expired,
)

__all__ = ["GrantCheck", "Presented"]


@dataclass(frozen=True, slots=True)
class Presented:
    """What a fenced write presented, as far as it is known before the transaction's first
    statement: the grant proved genuine for the token (None: a trusted caller, no verifier) and
    whether it had expired then (decided once: the wall clock may step back)."""

    grant: SignedGrant | None
    expired: bool = False

    @property
    def account(self) -> str | None:
        """The account whose key the grant names (None: a trusted caller, or not a payout key)."""
        if self.grant is None or not self.grant.key.startswith(PAYOUT_KEY_PREFIX):
            return None
        return self.grant.key.removeprefix(PAYOUT_KEY_PREFIX)

    @property
    def may_stamp(self) -> bool:
        """Whether the first statement may stamp a fence at all: a trusted caller's any account,
        a grant only its own key's account (`account`) and only while unexpired."""
        return self.grant is None or (self.account is not None and not self.expired)


class GrantCheck:
    """Whether a payout's write may proceed under the grant it presents: genuine for its token
    (`presented`, before the transaction's first statement), then for the payout's account and
    unexpired (`check_account`, once that statement read the account)."""

    def __init__(self, verifier: GrantVerifier | None, *, enforce_fencing: bool) -> None:
        # INV-07: with a verifier, every fenced write needs the lock service's signed grant for
        # the payout's account and the presented token. The worker always passes one; None is
        # for tests and tools that write as a trusted caller (docs/payment-database.md).
        self._verifier = verifier
        # The fencing switch (FR-29), as the fenced writer holds it: off, an expired grant's
        # holder is not told it is fenced out (the experiment's negative control).
        self._enforce_fencing = enforce_fencing

    def presented(self, payout_id: str, token: int, grant: GrantLike, operation: str) -> Presented:
        """The presented grant, once proved the lock service's grant for `token` (signature and
        token, in memory: nothing is read or written yet); `Presented(None)` without a verifier
        (a trusted caller). `InvalidGrant` otherwise. Whether it is for the payout's account,
        and unexpired, is `check_account`'s, once the payout's account is read."""
        if self._verifier is None:
            return Presented(None)
        try:
            genuine = self._verifier.verify(grant, key=None, token=token, check_expiry=False)
        except GrantError as exc:
            raise self._refused(exc, payout_id, token, operation) from None
        return Presented(genuine, expired=is_expired(genuine))

    async def check_account(
        self,
        conn: asyncpg.Connection,
        presented: Presented,
        account_id: str,
        *,
        payout_id: str,
        token: int,
        operation: str,
    ) -> None:
        """`InvalidGrant` unless the genuine grant is for `account_id`'s key and unexpired (a
        stale holder is told it is fenced out first). No-op for a trusted caller. Passing, it
        proves that the first statement was allowed to stamp `account_id` (`may_stamp`)."""
        genuine = presented.grant
        if genuine is None:
            return
        try:
            check_key(genuine, lock_key(account_id))
            if presented.expired:
                # A stale holder is told it is fenced out first (as the fenced writer's
                # classification of a miss does): read-only, an expired grant moves no
                # fence, not even to its own token.
                await self._refuse_if_fenced(conn, account_id, token)
                raise GrantExpired(f"grant expired at {genuine.expires_at.isoformat()}")
        except GrantError as exc:
            raise self._refused(exc, payout_id, token, operation) from None

    def _refused(self, exc: GrantError, payout_id: str, token: int, operation: str) -> InvalidGrant:
        log.warning(
            "grant.refused",
            enforcement_point="paydb",
            reason=exc.code,
            payout_id=payout_id,
            operation=operation,
            presented_token=token,
        )
        metrics.GRANT_REFUSED.labels(operation=operation, reason=exc.code).inc()
        return InvalidGrant(str(exc), reason=exc.code)

    async def _refuse_if_fenced(
        self, conn: asyncpg.Connection, account_id: str, token: int
    ) -> None:
        stored = await conn.fetchval(
            "SELECT fence FROM paydb.balances WHERE account_id = $1", account_id
        )
        if self._enforce_fencing and stored is not None and int(stored) > token:
            raise FencedOut(lock_key(account_id), token, int(stored))
