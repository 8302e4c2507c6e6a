"""Two holders, T1 < T2, interleaving their steps on one payout and account; a checker that
lists every invariant violation (INV-01/INV-05 ordering, INV-08, INV-03) of one run."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg

from ledger import (
    TERMINAL_STATES,
    AlreadyAdvanced,
    FencedOut,
    InvalidTransition,
    Payout,
    PayoutStore,
    WorkContext,
)
from ledger.queries import ledger_discrepancies
from tests.ledger.conftest import funded_account, new_id

T1, T2 = 100, 200
Step = Callable[[PayoutStore, str, int, WorkContext], Awaitable[Payout | AlreadyAdvanced]]

STEPS: dict[str, Step] = {
    "claim": lambda s, p, t, c: s.claim(p, t, c),
    "submit": lambda s, p, t, c: s.mark_submitted(p, t, c),
    "ack": lambda s, p, t, c: s.mark_acked(p, t, c),
    "decline": lambda s, p, t, c: s.mark_declined(p, t, c, reason="declined"),
    "ambiguous": lambda s, p, t, c: s.mark_ambiguous(p, t, c),
    "settled": lambda s, p, t, c: s.resolve_settled(p, t, c),
    "absent": lambda s, p, t, c: s.resolve_absent(p, t, c),
    "abandon": lambda s, p, t, c: s.abandon(p, t, c, operator="ops", reason="sla"),
    "post": lambda s, p, t, c: s.post(p, t, c),
}

#: The sequences of steps a holder may try (the state machine's paths from PENDING).
PLANS: dict[str, tuple[str, ...]] = {
    "ack": ("claim", "submit", "ack", "post"),
    "decline": ("claim", "submit", "decline"),
    "settled": ("claim", "submit", "ambiguous", "settled", "post"),
    "absent": ("claim", "submit", "ambiguous", "absent"),
    "abandon": ("claim", "submit", "ambiguous", "abandon"),
}


@dataclass
class Run:
    writes: list[tuple[int, str, str]] = field(default_factory=list)  # token, step, new state
    payout_fences: list[int] = field(default_factory=list)
    balance_fences: list[int] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


async def run_interleaving(
    store: PayoutStore,
    pool: asyncpg.Pool,
    plans: tuple[Sequence[str], Sequence[str]],
    order: Sequence[int],
) -> Run:
    """Holder i (token T1 or T2) takes its next planned step each time `order` names it.

    Holders keep trying after a rejection: more stale attempts give the fence more chances to
    fail, so the check is stronger than a holder that aborts on its first FencedOut.
    """
    ctx = WorkContext(correlation_id=new_id("corr"), actor="holder")
    account = await funded_account(store, ctx, 1_000)
    payout = await store.create_payout(new_id("po"), account, 300, ctx)
    tokens = (T1, T2)
    cursor = [0, 0]
    run = Run()
    for holder in order:
        plan = plans[holder]
        if cursor[holder] >= len(plan):
            continue
        step = plan[cursor[holder]]
        cursor[holder] += 1
        try:
            result = await STEPS[step](store, payout.payout_id, tokens[holder], ctx)
        except (FencedOut, InvalidTransition):
            result = None
        if isinstance(result, Payout):
            run.writes.append((tokens[holder], step, str(result.state)))
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT p.state, p.fence, b.fence AS bfence FROM paydb.payouts p"
                " JOIN paydb.balances b USING (account_id) WHERE p.payout_id = $1",
                payout.payout_id,
            )
        run.states.append(row["state"])
        run.payout_fences.append(row["fence"])
        run.balance_fences.append(row["bfence"])
    async with pool.acquire() as conn:
        groups = await conn.fetchval(
            "SELECT count(*) FROM paydb.ledger_groups WHERE payout_id = $1", payout.payout_id
        )
        discrepancies = await ledger_discrepancies(conn)
    run.violations = _violations(run, groups, len(discrepancies))
    return run


def _violations(run: Run, groups: int, discrepancies: int) -> list[str]:
    found = []
    highest = 0
    for token, step, _ in run.writes:
        if token < highest:
            found.append(f"INV-01/05: {step} under T{token} landed after a write under T{highest}")
        highest = max(highest, token)
    for name, fences in (("payout", run.payout_fences), ("balance", run.balance_fences)):
        if any(b < a for a, b in itertools.pairwise(fences)):
            found.append(f"INV-05: {name} fence decreased: {fences}")
    terminal = {str(s) for s in TERMINAL_STATES}
    for i, state in enumerate(run.states):
        if state in terminal and any(s != state for s in run.states[i:]):
            found.append(f"INV-08: terminal {state} changed: {run.states}")
            break
    if groups > 1:
        found.append(f"double posting: {groups} ledger groups")
    if discrepancies:
        found.append(f"INV-03: {discrepancies} ledger discrepancies")
    return found
