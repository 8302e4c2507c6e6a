"""What the PostgreSQL lock backend's grant path and its operator actions share: the NOTIFY
channel that wakes blocked acquirers, the mapping of a lost connection to BackendUnavailable, the
session id's form, and the end of a grant's history row.

Must never: leak a driver exception (callers fail closed on BackendUnavailable, FR-27), or date
the end of an expired session's grant later than its expiry (end_grant, INV-06 evidence).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg

from common.outage import CONNECTION_LOST, connection_lost
from lockservice.api import BackendUnavailable

BACKEND = "postgres"
CHANNEL = "lockservice_release"
#: A lost, closing or refused connection (common.outage), e.g. one the server dropped while it
#: sat idle, used before its EOF was read (asyncpg's Pool terminates it; the next call gets a new
#: one).
CONNECTION_ERRORS = CONNECTION_LOST


@contextlib.contextmanager
def unavailable_on_connection_error() -> Iterator[None]:
    """Callers fail closed on BackendUnavailable (FR-27); never leak driver exceptions."""
    try:
        yield
    except CONNECTION_ERRORS as exc:
        if not connection_lost(exc):
            raise
        raise BackendUnavailable(f"postgres lock backend unreachable: {exc!r}") from exc


def session_uuid(session_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(session_id)
    except (ValueError, TypeError, AttributeError):
        return None


async def end_history(
    conn: asyncpg.Connection, full: str, token: int, reason: str, session_expires: Any
) -> None:
    """A grant of an already expired session ended at its expiry, not now (end_grant)."""
    await conn.execute(
        "SELECT lockservice.end_grant($1, $2, $3, $4)", full, token, reason, session_expires
    )
