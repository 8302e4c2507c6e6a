"""The chaos run's downstream check: every staged posting reached the finance ledger once.

Owns: comparing the payment database's outbox with the finance ledger's book after a run
(issue 26 §3: publishers killed and the ledger restarted mid-run). Must never: write to either.

What it counts, by event id (the outbox row's primary key, which the ledger keeps on each
record): `delivered` rows the outbox marked delivered; `missing` delivered rows the book does not
hold (a ledger that forgot across a restart); `booked_twice` event ids the book holds more than
once (a redelivery booked again); `unknown` records of no outbox row; `pending` and
`dead_letter` rows left undelivered after the bounded drain.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx

from stack.system import Stack

#: How long the publishers get, after the run settled, to deliver what is still pending.
DRAIN_WAIT_S = 120.0


async def downstream(stack: Stack, progress: Callable[[str], None]) -> dict[str, Any]:
    """The counts above, once no row is pending (or DRAIN_WAIT_S passed)."""
    if stack.finledger_url is None:
        return {"checked": False}
    conn = await asyncpg.connect(stack.database_url)
    try:
        deadline = time.monotonic() + DRAIN_WAIT_S
        while True:
            pending = int(
                await conn.fetchval("SELECT count(*) FROM paydb.outbox WHERE status = 'pending'")
            )
            if pending == 0 or time.monotonic() > deadline:
                break
            progress(f"waiting for the outbox publishers: {pending} row(s) pending")
            await asyncio.sleep(2.0)
        rows = await conn.fetch("SELECT event_id::text AS event_id, status FROM paydb.outbox")
    finally:
        await conn.close()
    async with httpx.AsyncClient(timeout=60, headers=stack.operator_headers()) as http:
        r = await http.get(f"{stack.finledger_url}/v1/records")
        r.raise_for_status()
        booked = Counter(str(rec["event_id"]) for rec in r.json()["records"])
    delivered = {str(r["event_id"]) for r in rows if r["status"] == "delivered"}
    staged = {str(r["event_id"]) for r in rows}
    statuses = Counter(str(r["status"]) for r in rows)
    return {
        "checked": True,
        "staged": len(staged),
        "delivered": len(delivered),
        "pending": statuses.get("pending", 0),
        "dead_letter": sum(n for s, n in statuses.items() if s not in ("pending", "delivered")),
        "ledger_records": sum(booked.values()),
        "missing": len(delivered - set(booked)),
        "booked_twice": sum(1 for n in booked.values() if n > 1),
        "unknown": len(set(booked) - staged),
    }
