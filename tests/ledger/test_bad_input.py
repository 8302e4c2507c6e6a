"""Bad input gets a clear typed error and writes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from ledger import (
    DuplicateAccount,
    DuplicatePayout,
    InvalidAmount,
    InvalidIdentifier,
    InvalidToken,
    PaydbError,
    PayoutStore,
    UnknownAccount,
    UnknownPayout,
    UnknownState,
    WorkContext,
)
from tests.ledger.conftest import funded_account, new_id, row_counts

BIG = 1 << 63  # one past bigint
#: An amount from a caller the type checker does not see (JSON, an untyped caller): the store
#: refuses it at run time.
FLOAT_AMOUNT: Any = 1.5

Case = Callable[[PayoutStore, WorkContext, str, str], Awaitable[Any]]

CASES: list[tuple[str, Case, type[PaydbError]]] = [
    ("zero amount", lambda s, c, a, p: s.create_payout(new_id("po"), a, 0, c), InvalidAmount),
    ("negative amount", lambda s, c, a, p: s.create_payout(new_id("po"), a, -5, c), InvalidAmount),
    (
        "amount beyond bigint",
        lambda s, c, a, p: s.create_payout(new_id("po"), a, BIG, c),
        InvalidAmount,
    ),
    (
        "float amount",
        lambda s, c, a, p: s.create_payout(new_id("po"), a, FLOAT_AMOUNT, c),
        InvalidAmount,
    ),
    ("bool amount", lambda s, c, a, p: s.create_payout(new_id("po"), a, True, c), InvalidAmount),
    ("zero funding", lambda s, c, a, p: s.fund_account(a, 0, c), InvalidAmount),
    ("funding beyond bigint", lambda s, c, a, p: s.fund_account(a, BIG, c), InvalidAmount),
    ("funding overflows balance", lambda s, c, a, p: s.fund_account(a, BIG - 1, c), InvalidAmount),
    (
        "unknown account",
        lambda s, c, a, p: s.create_payout(new_id("po"), "acct-nobody", 5, c),
        UnknownAccount,
    ),
    (
        "fund unknown account",
        lambda s, c, a, p: s.fund_account("acct-nobody", 5, c),
        UnknownAccount,
    ),
    (
        "payout from system account",
        lambda s, c, a, p: s.create_payout(new_id("po"), "rail_clearing", 5, c),
        InvalidIdentifier,
    ),
    ("duplicate payout", lambda s, c, a, p: s.create_payout(p, a, 5, c), DuplicatePayout),
    ("duplicate account", lambda s, c, a, p: s.create_account(a, c), DuplicateAccount),
    (
        "system account name",
        lambda s, c, a, p: s.create_account("funding_source", c),
        DuplicateAccount,
    ),
    (
        "malformed account id",
        lambda s, c, a, p: s.create_account("acct 1; drop", c),
        InvalidIdentifier,
    ),
    ("empty payout id", lambda s, c, a, p: s.create_payout("", a, 5, c), InvalidIdentifier),
    ("unknown payout", lambda s, c, a, p: s.claim("po-nobody", 1, c), UnknownPayout),
    ("zero token", lambda s, c, a, p: s.claim(p, 0, c), InvalidToken),
    ("token beyond bigint", lambda s, c, a, p: s.mark_submitted(p, BIG, c), InvalidToken),
    (
        "empty decline reason",
        lambda s, c, a, p: s.mark_declined(p, 1, c, reason=" "),
        InvalidIdentifier,
    ),
    (
        "abandon without operator",
        lambda s, c, a, p: s.abandon(p, 1, c, operator="", reason="x"),
        InvalidIdentifier,
    ),
    ("unknown state name", lambda s, c, a, p: s.list_payouts(state="SETTLED"), UnknownState),
    ("balance of unknown account", lambda s, c, a, p: s.balance("acct-nobody"), UnknownAccount),
]


@pytest.mark.parametrize(("name", "call", "error"), CASES, ids=[c[0] for c in CASES])
async def test_bad_input_is_typed_and_writes_nothing(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    name: str,
    call: Case,
    error: type[PaydbError],
) -> None:
    """Each bad input raises its own PaydbError subclass and no table gains or loses a row."""
    account = await funded_account(store, ctx, 100)
    payout = await store.create_payout(new_id("po"), account, 10, ctx)
    before = await row_counts(pool)
    balance_before = await store.balance(account)
    with pytest.raises(error):
        await call(store, ctx, account, payout.payout_id)
    assert await row_counts(pool) == before
    assert await store.balance(account) == balance_before
    assert (await store.get_payout(payout.payout_id)).fence == 0
