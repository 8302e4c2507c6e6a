"""Outbox rows, written inside the caller's transaction (STD01-10, STD01-04 event context).

The row commits or rolls back with the business change it reports; the publisher delivers
unpublished rows at least once and never regenerates `event_id`.

What is emitted is what the finance ledger books (docs/outbox.md#what-is-emitted): every ledger
posting (`ledger.posted`, funding and payout), every account opening, and the payout events no
posting stands for (`PAYOUT_EVENTS`). A payout's other transitions (created, claimed, submitted,
acked, and posted, which its `ledger.posted` already says with the amounts) are in the audit log
and the payout row, never sent downstream.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from ledger.context import WorkContext

#: Version of the paydb event contract; bump on an incompatible payload change.
CONTRACT_VERSION = "paydb.v1"

#: Payout states whose transition is emitted as `payout.<state>`: the outcomes without a posting
#: (declined or abandoned) and the money-in-doubt state finance must hear of before it resolves.
PAYOUT_EVENTS: frozenset[str] = frozenset({"RAIL_AMBIGUOUS", "FAILED", "ABANDONED"})


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
    event_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO paydb.outbox"
        " (event_id, event_type, correlation_id, causation_id, contract_version, payload)"
        " VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
        event_id,
        event_type,
        correlation_id or ctx.correlation_id,
        ctx.causation_id,
        CONTRACT_VERSION,
        json.dumps(payload, sort_keys=True, default=str),
    )
    return event_id
