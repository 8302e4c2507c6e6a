"""Which stack a payment database and a Temporal namespace belong to: one id, marked in both.

`payouts up` (stack.system) draws a stack id and marks both sides with it: the payment schema's
comment (`COMMENT ON SCHEMA paydb`, no table and no migration: any role reads it with
`obj_description`) and the Temporal namespace's data (`payouts.stack_id`, what `temporal operator
namespace describe` shows). A command that writes (`payouts payout create|start-pending`) reads
both before writing anything: a database of one stack beside the Temporal of another is refused
(payouts.stackcheck), so a row never goes into one stack while its workflow goes onto another.
Neither side marked (a deployment that `payouts up` did not start, the test servers): nothing to
compare. Must never: write anything but the two marks, or decide more than "same stack or not".
"""

from __future__ import annotations

from typing import Any

import asyncpg

#: The key of the mark in the Temporal namespace's data.
TEMPORAL_KEY = "payouts.stack_id"
#: The payment schema's comment is this prefix and the id.
DB_PREFIX = "payouts stack "


async def mark_database(database_url: str, stack_id: str) -> None:
    """Mark the payment schema (the admin DSN: it owns the schema)."""
    conn = await asyncpg.connect(database_url)
    try:
        # COMMENT takes no parameters: the server quotes the text (quote_literal).
        literal = await conn.fetchval("SELECT quote_literal($1::text)", DB_PREFIX + stack_id)
        await conn.execute(f"COMMENT ON SCHEMA paydb IS {literal}")
    finally:
        await conn.close()


async def database_mark(conn: Any) -> str | None:
    """The stack id the payment schema is marked with, or None."""
    comment = await conn.fetchval("SELECT obj_description('paydb'::regnamespace, 'pg_namespace')")
    if isinstance(comment, str) and comment.startswith(DB_PREFIX):
        return comment.removeprefix(DB_PREFIX)
    return None


async def mark_temporal(client: Any, stack_id: str, namespace: str = "default") -> None:
    """Mark the Temporal namespace (its data map; other keys are kept)."""
    from temporalio.api.namespace.v1 import UpdateNamespaceInfo
    from temporalio.api.workflowservice.v1 import UpdateNamespaceRequest

    await client.workflow_service.update_namespace(
        UpdateNamespaceRequest(
            namespace=namespace, update_info=UpdateNamespaceInfo(data={TEMPORAL_KEY: stack_id})
        )
    )


async def temporal_mark(client: Any, namespace: str = "default") -> str | None:
    """The stack id the Temporal namespace is marked with, or None."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

    desc = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=namespace)
    )
    value = desc.namespace_info.data.get(TEMPORAL_KEY)
    return str(value) if value else None
