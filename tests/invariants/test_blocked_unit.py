"""Unit tests of INV-10's blocked-account rule (invariants.blocked): a payout lock held by a live
session and unused past the bound is reported; one used recently (a write or a proxy attempt
under its token), or younger than the bound, is not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from invariants.evidence import HOLD_BOUND_S, AttemptRow, Evidence, HoldFact, PayoutRow, Write
from invariants.rules import check

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def hold(token: int, acquired: float, observed: float, key: str = "payout:a") -> HoldFact:
    return HoldFact(key=key, token=token, session_id="s1", acquired_at=at(acquired),
                    observed_at=at(observed))  # fmt: skip


def posted(token: int, when: float) -> Write:
    return Write(audit_id=1, at=at(when), token=token, action="post", payout_id="p",
                 account_id="a", from_state="RAIL_ACKED", to_state="POSTED")  # fmt: skip


def inv10(ev: Evidence) -> list[str]:
    return check(ev)["INV-10"]


def test_a_lock_held_unused_past_the_bound_blocks_its_account() -> None:
    """The payout POSTED at t=10 under token 7, whose release was lost: at t=10 + bound + 1 its
    lock is still held by a live session, and the account's next payout waits behind it."""
    ev = Evidence(
        writes=[posted(7, 10)],
        payouts=[PayoutRow("p", "a", "POSTED", 7, "r1"), PayoutRow("q", "a", "PENDING", 0, "r2")],
        holds=[hold(7, 5, 10 + HOLD_BOUND_S + 1)],
        holds_checked=True,
    )
    [only] = inv10(ev)
    assert only.startswith("account a blocked: payout:a held under token=7 by live session s1")
    assert "unused for 91s (bound 90s); 1 payout(s) of the account not terminal" in only


def test_a_lock_used_within_the_bound_or_younger_than_it_is_not_reported() -> None:
    """The boundary: unused for exactly the bound is not yet blocked; a proxy attempt under the
    token counts as a use as much as a write; a fresh grant with no write yet is in use."""
    assert inv10(Evidence(writes=[posted(7, 10)], holds=[hold(7, 5, 10 + HOLD_BOUND_S)])) == []
    attempt = AttemptRow(1, "p", "a", "r1", 7, None, at(100))
    assert (
        inv10(Evidence(writes=[posted(7, 10)], attempts=[attempt], holds=[hold(7, 5, 150)])) == []
    )
    assert inv10(Evidence(holds=[hold(9, 100, 100 + HOLD_BOUND_S - 1)])) == []


def test_a_write_under_another_token_or_account_is_not_a_use() -> None:
    """Only the held token's own uses on its own account count."""
    older = posted(6, 100)  # the previous holder's write: says nothing about token 7
    ev = Evidence(writes=[older], holds=[hold(7, 0, 100 + HOLD_BOUND_S / 2)], hold_bound_s=30)
    assert len(inv10(ev)) == 1
    other = Write(2, at(100), 7, "post", "x", "b", "RAIL_ACKED", "POSTED")
    ev = Evidence(writes=[other], holds=[hold(7, 0, 101)], hold_bound_s=30)
    assert len(inv10(ev)) == 1


def test_a_non_payout_key_is_never_an_account() -> None:
    """The chaos harness's probe keys and any other namespace are not judged."""
    ev = Evidence(holds=[hold(1, 0, 10_000, key="chaos:probe-1")])
    assert inv10(ev) == []
