"""Outbox rows, written inside the caller's transaction (STD01-10, STD01-04 event context).

The row commits or rolls back with the business change it reports; the publisher (a later issue)
delivers unpublished rows at least once and never regenerates `event_id`. Each row also carries
the trace context current when it was staged (W3C `traceparent`/`tracestate`, migration 004):
the publisher continues that trace when it delivers the row (docs/tracing.md).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from common import tracing
from ledger.context import WorkContext

#: Version of the paydb event contract; bump on an incompatible payload change.
CONTRACT_VERSION = "paydb.v1"


#: An outbox row's columns, in the order of `event_values`; a statement that stages the row
#: itself (`ledger.store.fenced`: the transition's one statement) names the same.
EVENT_COLUMNS = (
    "event_id, event_type, correlation_id, causation_id, contract_version, payload,"
    " traceparent, tracestate"
)


def event_values(
    *,
    event_type: str,
    ctx: WorkContext,
    payload: dict[str, Any],
    correlation_id: str | None = None,
) -> tuple[uuid.UUID, str, str, str | None, str, str, str | None, str | None]:
    """One outbox row's values for `EVENT_COLUMNS`: a new event id, the payload as JSON, and the
    trace context current now (the caller's span, not the statement's)."""
    trace_context = tracing.carrier()
    return (
        uuid.uuid4(),
        event_type,
        correlation_id or ctx.correlation_id,
        ctx.causation_id,
        CONTRACT_VERSION,
        json.dumps(payload, sort_keys=True, default=str),
        trace_context.get("traceparent"),
        trace_context.get("tracestate"),
    )


async def write_event(
    conn: asyncpg.Connection,
    *,
    event_type: str,
    ctx: WorkContext,
    payload: dict[str, Any],
    correlation_id: str | None = None,
) -> uuid.UUID:
    """Insert one outbox row in the current transaction; returns its event id.

    `correlation_id` overrides the context's one where the consumer deduplicates on a more
    specific id (a ledger posting: `{account_id}:{payout_id}:{group_id}`).
    """
    if not conn.is_in_transaction():
        raise RuntimeError("outbox rows must be written inside the business transaction")
    values = event_values(
        event_type=event_type, ctx=ctx, payload=payload, correlation_id=correlation_id
    )
    await conn.execute(
        f"INSERT INTO paydb.outbox ({EVENT_COLUMNS})"
        " VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8)",
        *values,
    )
    return values[0]
