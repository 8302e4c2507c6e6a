"""What every part of the payout store shares: the pool, the fencing switch, the verifiers.

The parts (`ledger.store.fenced`, `.steps`, `.ambiguity`, `.seeding`, `.reads`) are mixins over
this base, composed into `PayoutStore` in `ledger.store`. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg

from common.logs import get_logger
from ledger.errors import InvalidIdentifier, UnknownAccount, UnknownPayout
from ledger.journal import SYSTEM_ACCOUNTS
from ledger.states import PayoutState
from lockservice.assertions import AssertionVerifier
from lockservice.grants import GrantVerifier, SignedGrant

S = PayoutState
#: What a fenced write may present: the signed grant (or its wire form); None = no grant.
GrantLike = SignedGrant | Mapping[str, Any] | None
#: One logger name for every part of the store: its events read as before the split.
log = get_logger("ledger.store")


class StoreBase:
    """The store's state, set once: the pool, the grant and assertion verifiers, and the switch."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        enforce_fencing: bool = True,
        verifier: GrantVerifier | None = None,
        verify_assertions: bool = True,
    ) -> None:
        self._pool = pool
        # Break-glass commands sent as Temporal signals (abandon) are authenticated by the lock
        # service's operator assertion, checked with the same public keys as grants. Off
        # (`verify_assertions=False`, an experiment switch) or without a verifier (a trusted
        # caller), the signal's free-text operator name is audited as given.
        self._assertions = (
            AssertionVerifier.of(verifier) if verifier is not None and verify_assertions else None
        )
        # INV-07: with a verifier, every fenced write needs the lock service's signed grant for
        # the payout's account and the presented token. The worker always passes one; None is
        # for tests and tools that write as a trusted caller (docs/payment-database.md).
        self._verifier = verifier
        # FR-29: the experiment switch. Off, the fence condition is dropped from every statement
        # and a stale holder CAN move money: only ever for the UC-03 negative control.
        self._enforce_fencing = enforce_fencing
        if not enforce_fencing:
            log.warning(
                "fencing.disabled",
                enforcement_point="paydb",
                detail="the fence condition is removed from every write: experiment only",
            )

    @property
    def enforce_fencing(self) -> bool:
        return self._enforce_fencing

    async def _payout_account(self, conn: asyncpg.Connection, payout_id: str) -> tuple[str, int]:
        row = await conn.fetchrow(
            "SELECT account_id, amount FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
        if row is None:
            raise UnknownPayout(f"unknown payout {payout_id!r}")
        return row["account_id"], int(row["amount"])

    async def _customer_account(self, conn: asyncpg.Connection, account_id: str) -> None:
        kind = await conn.fetchval(
            "SELECT kind FROM paydb.accounts WHERE account_id = $1", account_id
        )
        if kind is None:
            raise UnknownAccount(f"unknown account {account_id!r}")
        if kind != "customer" or account_id in SYSTEM_ACCOUNTS:
            raise InvalidIdentifier(f"{account_id} is a system account, not a customer account")
