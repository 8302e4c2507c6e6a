"""Before a command writes: the Temporal it reaches and the database it writes are one stack's.

Owns: `refuse_other_stack`, which compares the marks of common.stackmark (the stack id `payouts
up` puts in the payment schema's comment and in the Temporal namespace's data) and refuses a
mismatch with one line and EXIT_USAGE, before anything is written. A mark on one side only is a
mismatch too (a stack's database beside a Temporal that is not that stack's); no mark on either
side (not a `payouts up` stack) passes. Must never: write, or let a command go on after a
mismatch.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import asyncpg

from common.stackmark import database_mark, temporal_mark
from payouts.errors import EXIT_USAGE, CommandError


def _where(db_url: str) -> str:
    """The database's host, port and name, never its user or password."""
    parts = urlsplit(db_url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


async def refuse_other_stack(client: Any, address: str, db_url: str) -> None:
    """CommandError(EXIT_USAGE) if the two marks differ; nothing has been written yet."""
    conn = await asyncpg.connect(db_url)
    try:
        in_db = await database_mark(conn)
    finally:
        await conn.close()
    in_temporal = await temporal_mark(client)
    if in_db == in_temporal:
        return
    raise CommandError(
        f"the Temporal at {address} is stack {in_temporal or '(none)'}'s but the database at "
        f"{_where(db_url)} is stack {in_db or '(none)'}'s: nothing was written; point "
        "TEMPORAL_ADDRESS and DATABASE_URL at one stack (`. RUN/stack.env`)",
        EXIT_USAGE,
    )
