"""The outbox delivery SQL: claim, record an outcome, summary, and the operator actions.

Every statement here is short: a claim commits before any HTTP call is made (STD01-03), and a
batch's outcomes are one UPDATE, each row fenced by its claim (publisher id + attempt number).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ledger.audit import write_audit
from outbox.delivery import OPERABLE, NotActionable, Outcome, Status

ROW_COLUMNS = (
    "event_id, event_type, correlation_id, delivery_key, occurred_at, contract_version, payload,"
    " status, attempts, next_retry_at, last_outcome, last_error, delivered_at, claimed_by,"
    " claimed_until, traceparent, tracestate"
)


@dataclass(frozen=True)
class Claimed:
    event_id: uuid.UUID
    event_type: str
    delivery_key: str
    occurred_at: datetime
    contract_version: str
    payload: dict[str, Any]
    attempts: int  # including this claim: the fence for writing the outcome back
    #: The trace context the row was staged in (migration 004); None outside any trace.
    traceparent: str | None = None
    tracestate: str | None = None

    def trace_context(self) -> dict[str, str | None]:
        return {"traceparent": self.traceparent, "tracestate": self.tracestate}

    def record(self) -> dict[str, Any]:
        """The body sent downstream; the event id is the original one, never regenerated."""
        return {
            "event_id": str(self.event_id),
            "event_type": self.event_type,
            "account_id": str(self.payload.get("account_id") or ""),
            "occurred_at": self.occurred_at.isoformat(),
            "contract_version": self.contract_version,
            "payload": self.payload,
        }


# Due rows, oldest first. SKIP LOCKED lets several publishers claim disjoint batches at once;
# the lease condition keeps a row claimed by a live publisher out of everyone else's batch, so
# no row is ever sent by two publishers at the same time (a crashed one's lease runs out).
_CLAIM = f"""
WITH due AS (
    SELECT event_id FROM paydb.outbox
     WHERE status = 'pending'
       AND (next_retry_at IS NULL OR next_retry_at <= now())
       AND (claimed_until IS NULL OR claimed_until <= now())
     ORDER BY occurred_at, event_id
     LIMIT $1
     FOR UPDATE SKIP LOCKED
)
UPDATE paydb.outbox o
   SET claimed_by = $2, claimed_until = now() + make_interval(secs => $3),
       attempts = o.attempts + 1
  FROM due WHERE o.event_id = due.event_id
RETURNING {", ".join("o." + c.strip() for c in ROW_COLUMNS.split(","))}
"""


async def claim_batch(
    pool: asyncpg.Pool, *, publisher_id: str, limit: int, lease_s: float
) -> list[Claimed]:
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(_CLAIM, limit, publisher_id, lease_s)
    claimed = [
        Claimed(
            event_id=r["event_id"],
            event_type=r["event_type"],
            delivery_key=r["delivery_key"],
            occurred_at=r["occurred_at"],
            contract_version=r["contract_version"],
            payload=json.loads(r["payload"]),
            attempts=r["attempts"],
            traceparent=r["traceparent"],
            tracestate=r["tracestate"],
        )
        for r in rows
    ]
    return sorted(claimed, key=lambda c: c.occurred_at)


@dataclass(frozen=True)
class Verdict:
    """What one attempt's result writes back to its row."""

    row: Claimed
    status: Status
    outcome: Outcome
    error: str | None
    retry_in_s: float | None
    reason: str = ""  # why a dead letter: permanent | attempts_exhausted (logged, not stored)


async def record_outcomes(
    pool: asyncpg.Pool, verdicts: list[Verdict], *, publisher_id: str
) -> set[uuid.UUID]:
    """Write a whole batch's results back in ONE UPDATE, each row fenced exactly as
    a single outcome would be (our claim: publisher id + attempt number, still pending);
    returns the event ids written. A row missing from the result had lost its claim (lease
    expired, reclaimed or finished by someone else): nothing was written for it."""
    if not verdicts:
        return set()
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "UPDATE paydb.outbox o SET status = v.status, last_outcome = v.outcome,"
            " last_error = v.error,"
            " next_retry_at = CASE WHEN v.retry_in_s IS NULL THEN NULL"
            "   ELSE now() + make_interval(secs => v.retry_in_s) END,"
            " delivered_at = CASE WHEN v.status = 'delivered' THEN now() END,"
            " published_at = CASE WHEN v.status = 'delivered' THEN now() END,"
            " claimed_by = NULL, claimed_until = NULL"
            " FROM unnest($2::uuid[], $3::int[], $4::text[], $5::text[], $6::text[],"
            "   $7::float8[]) AS v(event_id, attempts, status, outcome, error, retry_in_s)"
            " WHERE o.event_id = v.event_id AND o.claimed_by = $1 AND o.attempts = v.attempts"
            "   AND o.status = 'pending'"
            " RETURNING o.event_id",
            publisher_id,
            [v.row.event_id for v in verdicts],
            [v.row.attempts for v in verdicts],
            [str(v.status) for v in verdicts],
            [str(v.outcome) for v in verdicts],
            [v.error for v in verdicts],
            [v.retry_in_s for v in verdicts],
        )
    return {r["event_id"] for r in rows}


async def outbox_summary(pool: asyncpg.Pool) -> dict[str, Any]:
    """Counts by status (every status present, zero included), how many pending rows are
    backing off, and the age in seconds of the oldest undelivered (pending) row."""
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT status, count(*) AS n FROM paydb.outbox GROUP BY status")
        extra = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE next_retry_at > now()) AS backing_off,"
            " EXTRACT(EPOCH FROM now() - min(occurred_at))::float8 AS oldest_age_s"
            " FROM paydb.outbox WHERE status = 'pending'"
        )
    summary: dict[str, Any] = {str(s): 0 for s in Status}
    summary.update({r["status"]: int(r["n"]) for r in rows})
    summary["total"] = sum(summary[str(s)] for s in Status)
    summary["backing_off"] = int(extra["backing_off"])
    summary["oldest_undelivered_age_s"] = extra["oldest_age_s"]
    return summary


#: The statuses whose rows the publisher's gauges count: each ends in delivered or discarded,
#: so there are only as many as are waiting, however large the table has grown.
_WAITING = (Status.PENDING, Status.DELIVERY_FAILED, Status.CONFLICT_BLOCKED)


async def backlog_summary(pool: asyncpg.Pool) -> dict[str, Any]:
    """The publisher's gauges: pending, delivery_failed and conflict_blocked counts and the age
    in seconds of the oldest pending row (None when none), in ONE statement that reads only
    those rows (index `outbox_status`).

    Why not `outbox_summary`: its GROUP BY status counts every row ever staged (delivered rows
    are kept), a scan that grows with the table; the publisher refreshes its gauges for as long
    as it runs, and on a table of millions of rows that scan would cost more than delivering."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'pending') AS pending,"
            " count(*) FILTER (WHERE status = 'delivery_failed') AS delivery_failed,"
            " count(*) FILTER (WHERE status = 'conflict_blocked') AS conflict_blocked,"
            " EXTRACT(EPOCH FROM now() - min(occurred_at) FILTER (WHERE status = 'pending'))"
            "::float8 AS oldest_age_s"
            " FROM paydb.outbox WHERE status = ANY($1::text[])",
            [str(s) for s in _WAITING],
        )
    return {
        "pending": int(row["pending"]),
        "delivery_failed": int(row["delivery_failed"]),
        "conflict_blocked": int(row["conflict_blocked"]),
        "oldest_undelivered_age_s": row["oldest_age_s"],
    }


async def list_rows(
    pool: asyncpg.Pool, *, status: Status | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            f"SELECT {ROW_COLUMNS} FROM paydb.outbox"
            " WHERE ($1::text IS NULL OR status = $1) ORDER BY occurred_at, event_id LIMIT $2",
            None if status is None else str(status),
            limit,
        )
    return [dict(r) | {"payload": json.loads(r["payload"])} for r in rows]


async def operator_action(
    pool: asyncpg.Pool,
    *,
    action: str,
    event_ids: list[uuid.UUID] | None,
    status: Status | None,
    operator: str,
    reason: str,
) -> list[uuid.UUID]:
    """`retry` (back to pending, attempts reset) or `discard` the named dead-lettered or
    conflict-blocked rows (or every row in `status`), auditing each one; returns the ids."""
    if not operator.strip() or not reason.strip():
        raise NotActionable("an operator action needs an operator and a reason")
    if action not in ("retry", "discard"):
        raise NotActionable(f"unknown action {action!r}")
    if (event_ids is None) == (status is None):
        raise NotActionable("name event ids or a status, not both")
    if status is not None and status not in OPERABLE:
        raise NotActionable(f"only {[str(s) for s in OPERABLE]} rows can be retried or discarded")
    operable = [str(s) for s in OPERABLE]
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            "SELECT event_id, status, delivery_key FROM paydb.outbox"
            " WHERE (event_id = ANY($1::uuid[]) OR ($1::uuid[] IS NULL AND status = $2))"
            " ORDER BY occurred_at FOR UPDATE",
            event_ids,
            None if status is None else str(status),
        )
        found = {r["event_id"] for r in rows}
        bad = [str(e) for e in event_ids or [] if e not in found]
        bad += [str(r["event_id"]) for r in rows if r["status"] not in operable]
        if bad:
            raise NotActionable(f"not dead-lettered or conflict-blocked (or unknown): {bad}")
        new_status = Status.PENDING if action == "retry" else Status.DISCARDED
        ids = [r["event_id"] for r in rows]
        await conn.execute(
            "UPDATE paydb.outbox SET status = $2, next_retry_at = NULL,"
            " attempts = CASE WHEN $2 = 'pending' THEN 0 ELSE attempts END,"
            " claimed_by = NULL, claimed_until = NULL WHERE event_id = ANY($1::uuid[])",
            ids,
            str(new_status),
        )
        if new_status is Status.PENDING:
            await conn.execute("SELECT pg_notify('paydb_outbox', '')")  # sent at COMMIT
        for r in rows:
            await write_audit(
                conn,
                actor=operator,
                action=f"outbox.{action}",
                details={
                    "event_id": str(r["event_id"]),
                    "delivery_key": r["delivery_key"],
                    "from_status": r["status"],
                    "to_status": str(new_status),
                    "reason": reason,
                },
            )
    return ids
