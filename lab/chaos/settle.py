"""When a chaos run has settled (lab.chaos.run): every payout terminal, or only escalated
RAIL_AMBIGUOUS ones left and nothing changing, judged on progress; and the progress lines while
it runs.

Owns: reading the run's payout states. Must never: write to the payment database, or judge a
run on a guess of how fast this machine drains its payouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import asyncpg

from common.outage import CONNECTION_LOST
from lab.chaos.options import ChaosOptions
from lab.chaos.summary import TERMINAL

__all__ = ["ESCALATED", "monitor_progress", "payout_states", "settle"]

#: A read of the states that a fault cut short (PostgreSQL restarted under it: a refused or
#: reset connection, or a new connection that meets the server's FATAL before its first query,
#: InternalClientError) is skipped and made again at the next turn: it judges nothing.
_READ_CUT: tuple[type[Exception], ...] = (*CONNECTION_LOST, asyncpg.PostgresError)


async def payout_states(database_url: str, prefix: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT state FROM paydb.payouts WHERE starts_with(account_id, $1)", prefix
        )
    finally:
        await conn.close()
    return [str(r["state"]) for r in rows]


#: A RAIL_AMBIGUOUS payout whose resolution SLA escalated (an `ambiguity_escalated` audit row):
#: an operator now owns it, so it no longer keeps the run from settling (INV-10).
ESCALATED = "RAIL_AMBIGUOUS:escalated"


async def _progress_states(database_url: str, prefix: str) -> list[str]:
    """Each payout's state, escalated ambiguity told apart (the escalation is a change too)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT p.state, EXISTS (SELECT 1 FROM paydb.audit_log a"
            "  WHERE a.payout_id = p.payout_id AND a.action = 'ambiguity_escalated') AS escalated"
            " FROM paydb.payouts p WHERE starts_with(p.account_id, $1)",
            prefix,
        )
    finally:
        await conn.close()
    return [
        ESCALATED if r["state"] == "RAIL_AMBIGUOUS" and r["escalated"] else str(r["state"])
        for r in rows
    ]


def _open(states: list[str]) -> int:
    """Payouts still moving: neither terminal nor escalated in RAIL_AMBIGUOUS."""
    return sum(1 for s in states if s not in TERMINAL and s != ESCALATED)


async def settle(
    database_url: str, prefix: str, opts: ChaosOptions, progress: Callable[[str], None]
) -> bool:
    """Wait until every payout is terminal, or only escalated RAIL_AMBIGUOUS ones remain and
    nothing has changed for `quiet_s`. False (not settled) when nothing changed for `stall_s`
    while payouts were still open, or after `settle_timeout_s` in all."""
    deadline = time.monotonic() + opts.settle_timeout_s
    last: list[str] = []
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        with contextlib.suppress(*_READ_CUT):
            states = sorted(await _progress_states(database_url, prefix))
            if states != last:
                last, last_change = states, time.monotonic()
        quiet = time.monotonic() - last_change
        if last and all(s in TERMINAL for s in last):
            return True
        if _open(last) == 0 and quiet >= opts.quiet_s:
            return True
        if quiet >= opts.stall_s:
            progress(f"no payout changed state for {quiet:.0f}s; {_open(last)} payout(s) open")
            return False
        await asyncio.sleep(1.0)
    progress(f"settle cap of {opts.settle_timeout_s:.0f}s spent; {_open(last)} payout(s) open")
    return False


async def monitor_progress(
    database_url: str,
    prefix: str,
    total: int,
    done: list[bool],
    progress: Callable[[str], None],
) -> None:
    """Progress lines: terminal counts every few seconds while the run goes on."""
    while True:
        await asyncio.sleep(5.0)
        with contextlib.suppress(*_READ_CUT):
            states = await payout_states(database_url, prefix)
            terminal = sum(1 for s in states if s in TERMINAL)
            ambiguous = states.count("RAIL_AMBIGUOUS")
            done[0] = terminal == total
            progress(f"progress: {terminal}/{total} terminal, {ambiguous} ambiguous")
