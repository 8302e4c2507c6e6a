"""Our payout states against the rail's evidence (the stub's `/admin/movements`), for tests.

The check INV-09 makes ("a FAILED payout has no settled movement at the rail"), widened to
ABANDONED for the slow-rail test: either state while the rail settled the money means the
beneficiary was paid and our ledger says nothing moved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg
import httpx

from tests.credentials import headers

NOTHING_MOVED = ("FAILED", "ABANDONED")


def nothing_moved_but_rail_settled(
    states: Mapping[str, str],
    movements: Iterable[Mapping[str, Any]],
    nothing_moved: Iterable[str] = NOTHING_MOVED,
) -> list[str]:
    """Client references whose payout state says nothing moved while the rail holds a settled
    movement for them (sorted). `states` maps client reference -> payout state."""
    settled = {m["client_reference"] for m in movements if m["status"] == "settled"}
    gone = set(nothing_moved)
    return sorted(ref for ref, state in states.items() if state in gone and ref in settled)


async def payout_states(database_url: str, payout_ids: Iterable[str]) -> dict[str, str]:
    """client reference -> state, from the payment database."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT client_reference, state FROM paydb.payouts WHERE payout_id = ANY($1)",
            list(payout_ids),
        )
    finally:
        await conn.close()
    return {r["client_reference"]: r["state"] for r in rows}


async def rail_movements(stub_url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=stub_url, timeout=10, headers=headers()) as http:
        r = await http.get("/admin/movements")
        r.raise_for_status()
        rows: list[dict[str, Any]] = r.json()["movements"]
    return rows
