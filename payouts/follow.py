"""Following payouts to terminal states: the one state-count query and `payout create --wait`'s
progress bar.

Owns: `payout_state_counts` (the one query every follower polls), `settle_payouts` (the demo's
and the end-to-end benchmark's wait, reporting each changed count line) and `follow_payouts`
(`--wait`'s progress bar). Must never: write anything.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable

import asyncpg

from ledger.states import TERMINAL_STATES


def terminal_count(counts: dict[str, int]) -> int:
    """How many of the counted payouts are in a terminal state (ledger.states)."""
    return sum(counts.get(str(t), 0) for t in TERMINAL_STATES)


def progress_line(counts: dict[str, int], total: int, width: int = 30) -> str:
    done = terminal_count(counts)
    filled = width * done // max(1, total)
    states = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} terminal  {states}"


async def payout_state_counts(
    db: asyncpg.Connection | asyncpg.Pool, ids: list[str]
) -> Counter[str]:
    """How many of the payouts `ids` are in each state (the one query every follower polls)."""
    rows = await db.fetch(
        "SELECT state, count(*) AS n FROM paydb.payouts WHERE payout_id = ANY($1::text[])"
        " GROUP BY state",
        ids,
    )
    return Counter({r["state"]: int(r["n"]) for r in rows})


async def settle_payouts(
    db: asyncpg.Connection | asyncpg.Pool,
    ids: list[str],
    *,
    timeout_s: float,
    progress: Callable[[str], None],
    interval_s: float = 1.0,
    label: str = "",
) -> Counter[str]:
    """Poll until every payout of `ids` is terminal or `timeout_s` has passed, reporting each
    changed count line through `progress`; returns the last counts (the caller judges them)."""
    deadline = time.monotonic() + timeout_s
    states: Counter[str] = Counter()
    last = ""
    while time.monotonic() < deadline:
        states = await payout_state_counts(db, ids)
        done = terminal_count(dict(states))
        counts = "  ".join(f"{k}={v}" for k, v in sorted(states.items()))
        line = f"{label}{done}/{len(ids)} terminal  {counts}"
        if line != last:
            progress(line)
            last = line
        if done == len(ids):
            break
        await asyncio.sleep(interval_s)
    return states


async def follow_payouts(db_url: str, payout_ids: list[str], timeout_s: float) -> dict[str, int]:
    """Poll the payouts' states until every one is terminal (or `timeout_s`), drawing a progress
    bar on stderr (redrawn in place on a terminal, one line every 5 s otherwise)."""
    tty = sys.stderr.isatty()
    conn = await asyncpg.connect(db_url)
    counts: dict[str, int] = {}
    try:
        deadline = time.monotonic() + timeout_s
        last_line = 0.0
        while True:
            counts = dict(await payout_state_counts(conn, payout_ids))
            finished = terminal_count(counts) == len(payout_ids)
            line = progress_line(counts, len(payout_ids))
            if tty:
                sys.stderr.write("\r" + line)
            elif finished or time.monotonic() - last_line >= 5:
                sys.stderr.write(line + "\n")
                last_line = time.monotonic()
            sys.stderr.flush()
            if finished or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
    finally:
        await conn.close()
        if tty:
            sys.stderr.write("\n")
    return counts
