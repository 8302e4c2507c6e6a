"""Grant verification glue (INV-07): a fenced write must present the lock service's signed grant
of the payout's account key for its token, checked before the transaction writes anything.

`GrantCheck` is owned by the fenced writer (`ledger.store.fenced`), which calls it first in every
fenced transaction; nothing else in the store checks grants.
"""

from __future__ import annotations

import asyncpg

from common.lockkey import lock_key
from ledger import metrics
from ledger.errors import FencedOut, InvalidGrant
from ledger.store.base import GrantLike, log, payout_account
from lockservice.verifiers import GrantError, GrantExpired, GrantVerifier, is_expired

__all__ = ["GrantCheck"]


class GrantCheck:
    """Which account a payout's write is for, once its grant is proved genuine."""

    def __init__(self, verifier: GrantVerifier | None, *, enforce_fencing: bool) -> None:
        # INV-07: with a verifier, every fenced write needs the lock service's signed grant for
        # the payout's account and the presented token. The worker always passes one; None is
        # for tests and tools that write as a trusted caller (docs/payment-database.md).
        self._verifier = verifier
        # The fencing switch (FR-29), as the fenced writer holds it: off, an expired grant's
        # holder is not told it is fenced out (the experiment's negative control).
        self._enforce_fencing = enforce_fencing

    async def granted_account(
        self,
        conn: asyncpg.Connection,
        payout_id: str,
        token: int,
        grant: GrantLike,
        operation: str,
    ) -> tuple[str, int]:
        """The payout's account and amount, once the grant is proved to be the lock service's
        grant of that account's key for `token` (INV-07); `InvalidGrant` otherwise.

        Runs before any write of the transaction (only the payout's account is read first, to
        know which key the grant must be for). What it prevents: a made-up token raising the
        account's fence above anything the lock service can issue, or moving a payout. Whether
        the genuine token is the newest is still the fence's decision, next.
        """
        account_id, amount = await payout_account(conn, payout_id)
        if self._verifier is not None:
            try:
                genuine = self._verifier.verify(
                    grant, key=lock_key(account_id), token=token, check_expiry=False
                )
                if is_expired(genuine):
                    # A stale holder is told it is fenced out first (as the fenced writer's
                    # classification of a miss does): read-only, an expired grant moves no
                    # fence, not even to its own token.
                    await self._refuse_if_fenced(conn, account_id, token)
                    raise GrantExpired(f"grant expired at {genuine.expires_at.isoformat()}")
            except GrantError as exc:
                log.warning(
                    "grant.refused",
                    enforcement_point="paydb",
                    reason=exc.code,
                    payout_id=payout_id,
                    operation=operation,
                    presented_token=token,
                )
                metrics.GRANT_REFUSED.labels(operation=operation, reason=exc.code).inc()
                raise InvalidGrant(str(exc), reason=exc.code) from None
        return account_id, amount

    async def _refuse_if_fenced(
        self, conn: asyncpg.Connection, account_id: str, token: int
    ) -> None:
        stored = await conn.fetchval(
            "SELECT fence FROM paydb.balances WHERE account_id = $1", account_id
        )
        if self._enforce_fencing and stored is not None and int(stored) > token:
            raise FencedOut(lock_key(account_id), token, int(stored))
