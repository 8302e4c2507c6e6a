"""What every part of the payout store reads alike: the grant type, the state alias, the one
logger, and the lookup of a customer account. Nothing here writes.

No class here: each part of the store (`ledger.store.fenced`, `.steps`, `.ambiguity`,
`.commands`, `.seeding`, `.reads`) is an object of its own, handed what it uses (the pool, the
fenced writer, the assertion verifier) by `PayoutStore` (`ledger.store.payout_store`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import asyncpg

from common.logs import get_logger
from ledger.errors import InvalidIdentifier, UnknownAccount
from ledger.journal import SYSTEM_ACCOUNTS
from ledger.states import PayoutState
from lockservice.verifiers import SignedGrant

__all__ = ["GrantLike", "S", "customer_account", "log"]

S = PayoutState
#: What a fenced write may present: the signed grant (or its wire form); None = no grant.
GrantLike = SignedGrant | Mapping[str, Any] | None
#: One logger name for every part of the store: its events read as before the split.
log = get_logger("ledger.store")


async def customer_account(conn: asyncpg.Connection, account_id: str) -> None:
    """Refuse anything but an existing customer account (a system account takes no payouts)."""
    kind = await conn.fetchval("SELECT kind FROM paydb.accounts WHERE account_id = $1", account_id)
    if kind is None:
        raise UnknownAccount(f"unknown account {account_id!r}")
    if kind != "customer" or account_id in SYSTEM_ACCOUNTS:
        raise InvalidIdentifier(f"{account_id} is a system account, not a customer account")
