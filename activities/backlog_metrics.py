"""The payout backlog's age, as Prometheus gauges of the worker process (UC-05, UC-08 SLIs).

Owns: reading, every REFRESH_S, the age of the oldest payout in each state an operator is paged
on (PENDING: the backlog; RAIL_AMBIGUOUS: the 4 h resolution SLA, A-10) from the payment
database, and exporting it with no label but the state name (NFR-09). Must never: write to any
schema, or feed a correctness decision (an age is a symptom for people; recovery is decided by
state and evidence, never by elapsed time, FR-24).

Every worker exports the same figures (they read the same database); the alert rules take the
max over the fleet, so one frozen worker does not blind them.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from prometheus_client import Gauge

from common.outage import CONNECTION_LOST

#: The states whose oldest member's age is an alerting SLI (a closed set: the only label value).
AGED_STATES = ("PENDING", "RAIL_AMBIGUOUS")
REFRESH_S = 2.0

OLDEST_AGE = Gauge(
    "paydb_oldest_payout_age_seconds",
    "Age of the oldest payout in the state, since its last transition (0 when none).",
    ["state"],
)
COUNT = Gauge("paydb_payouts_in_state", "Payouts currently in the state.", ["state"])
REFRESHED = Gauge(
    "paydb_backlog_refreshed_timestamp_seconds",
    "Unix time of the last successful read of the backlog (alert when it goes stale).",
)

_QUERY = """
SELECT state, count(*) AS n,
       COALESCE(EXTRACT(EPOCH FROM now() - min(updated_at)), 0)::float8 AS oldest_s,
       EXTRACT(EPOCH FROM now())::float8 AS now_s
  FROM paydb.payouts WHERE state = ANY($1::text[]) GROUP BY state
"""


async def refresh_once(pool: asyncpg.Pool) -> None:
    """One read (read-only; the clock is the database's, like the state stamps)."""
    rows = await pool.fetch(_QUERY, list(AGED_STATES))
    seen = {r["state"]: r for r in rows}
    for state in AGED_STATES:
        row = seen.get(state)
        OLDEST_AGE.labels(state=state).set(row["oldest_s"] if row else 0.0)
        COUNT.labels(state=state).set(row["n"] if row else 0)
    if rows:
        REFRESHED.set(rows[0]["now_s"])
    else:
        REFRESHED.set(await pool.fetchval("SELECT EXTRACT(EPOCH FROM now())::float8"))


async def refresh_forever(pool: asyncpg.Pool, interval_s: float = REFRESH_S) -> None:
    """Refresh until cancelled; a failed read leaves the last figures (and the stale stamp)."""
    for state in AGED_STATES:  # export zeros from the start, so absent never means healthy
        OLDEST_AGE.labels(state=state)
        COUNT.labels(state=state)
    while True:
        # Any database error, an outage included (common.outage: also a connection left
        # mid-protocol by a restart, which used to escape and end this loop for good).
        with contextlib.suppress(*CONNECTION_LOST, asyncpg.PostgresError):
            await asyncio.wait_for(refresh_once(pool), timeout=interval_s * 2)
        await asyncio.sleep(interval_s)
