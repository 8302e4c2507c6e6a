"""The proxy's own tables (schema `railproxy`): fences and attempts. SQL only, no policy.

(The Connection's shared budget, `budget_slots`, is `railproxy.budget`'s.)"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from railproxy import budget
from railproxy.budget import Lease
from railproxy.errors import DeadlineExceeded, DuplicateSubmission, StaleToken
from railproxy.models import AttemptRecord, Outcome, SubmitRequest
from railproxy.settings import ProxySettings

S = "railproxy"

# FR-17 ({0} the account, {1} the token): raise the account's high-water mark to T only if
# T >= it (equal = same grant taking its next step). A lower token updates zero rows and
# RETURNING yields nothing: the caller is stale. The row lock taken here also serialises
# concurrent submits of one account.
_FENCE_SQL = f"""
INSERT INTO {S}.account_fences AS f (account_id, high_token) VALUES ({{0}}, {{1}})
ON CONFLICT (account_id) DO UPDATE SET high_token = EXCLUDED.high_token, updated_at = now()
    WHERE f.high_token <= EXCLUDED.high_token
RETURNING high_token
"""
# Fencing disabled (experiment only, FR-29): keep the evidence of the highest token, never reject.
_FENCE_UNCHECKED_SQL = f"""
INSERT INTO {S}.account_fences AS f (account_id, high_token) VALUES ({{0}}, {{1}})
ON CONFLICT (account_id) DO UPDATE
    SET high_token = GREATEST(f.high_token, EXCLUDED.high_token), updated_at = now()
RETURNING high_token
"""
_FENCE = _FENCE_SQL.format("$1", "$2")
_FENCE_UNCHECKED = _FENCE_UNCHECKED_SQL.format("$1", "$2")
_HIGH = f"SELECT high_token FROM {S}.account_fences WHERE account_id = $1"
# The deadline is checked on the database's clock in the same statement: an attempt is never
# recorded after the caller's deadline, so "no attempt row after the deadline" is conclusive.
_COLUMNS = """payout_id, account_id, amount, client_reference, token,
    correlation_id, causation_id, deadline_at, adapter_version, contract_version, connection_id,
    fencing_enforced, guard_bypassed, replica_id"""
_VALUES = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14"
# The fence, the guard and the attempt in ONE statement (issue 29: three round trips were one
# each), $15 = the guard is on. The fence's upsert runs first (the insert's condition reads it)
# and takes the account's row lock; the attempt is inserted only if the fence admitted T, no
# live attempt of the payout was seen, and the deadline has not passed. `live` reads the
# statement's snapshot, taken before any wait for that row lock: an attempt committed during the
# wait is not seen there, and the partial unique index attempts_one_live_per_payout refuses the
# insert instead (UniqueViolation, the same refusal). `high_token` is NULL for a stale token.
_RECORD = f"""
WITH fenced AS ({{fence}}),
live AS (
    SELECT attempt_id FROM {S}.attempts
    WHERE $15 AND payout_id = $1 AND outcome IS DISTINCT FROM 'NOT_SUBMITTED' LIMIT 1
),
recorded AS (
    INSERT INTO {S}.attempts ({_COLUMNS})
    SELECT {_VALUES} WHERE now() < $8
        AND EXISTS (SELECT FROM fenced) AND NOT EXISTS (SELECT FROM live)
    RETURNING attempt_id
)
SELECT (SELECT high_token FROM fenced) AS high_token, EXISTS (SELECT FROM live) AS live,
    (SELECT attempt_id FROM recorded) AS attempt_id
"""
_RECORD_FENCED = _RECORD.format(fence=_FENCE_SQL.format("$2", "$5"))
_RECORD_UNCHECKED = _RECORD.format(fence=_FENCE_UNCHECKED_SQL.format("$2", "$5"))
_OUTCOME = f"""
UPDATE {S}.attempts SET outcome = $2, rail_status = $3, rail_movement_id = $4, error_class = $5,
    completed_at = now()
WHERE attempt_id = $1 AND outcome IS NULL
"""
# The same write, freeing the attempt's slot of the Connection's budget in the same statement
# (one commit for both; the release's parameters are $6..$9). Both parts are idempotent.
_OUTCOME_RELEASING = f"WITH freed AS ({budget.release_sql(first=6)}) {_OUTCOME}"


async def raise_fence(pool: asyncpg.Pool, req: SubmitRequest, settings: ProxySettings) -> None:
    """Raise the account's high-water mark to T in its own short transaction, for a request a
    gate refuses before its attempt is recorded; raises `StaleToken` for a lower token. The
    point: the newest holder's token is on record here although nothing was forwarded for it."""
    async with pool.acquire() as conn, conn.transaction():
        await _fence(conn, req, settings)


async def check_not_stale(pool: asyncpg.Pool, req: SubmitRequest) -> None:
    """`StaleToken` if the account's mark is above T; reads only (an expired grant's request)."""
    highest = await pool.fetchval(_HIGH, req.account_id)
    if highest is not None and highest > req.token:
        raise _stale(req, highest)


async def _fence(conn: asyncpg.Connection, req: SubmitRequest, settings: ProxySettings) -> None:
    if not settings.enforce_fencing:
        await conn.fetchval(_FENCE_UNCHECKED, req.account_id, req.token)
        return
    if await conn.fetchval(_FENCE, req.account_id, req.token) is None:
        raise _stale(req, await conn.fetchval(_HIGH, req.account_id))


def _stale(req: SubmitRequest, highest: int | None) -> StaleToken:
    return StaleToken(
        f"token {req.token} is below the account's highest token {highest}",
        presented_token=req.token,
        highest_token=highest,
    )


async def record_attempt(
    pool: asyncpg.Pool,
    req: SubmitRequest,
    settings: ProxySettings,
    take: Callable[[asyncpg.Connection], Awaitable[Lease]],
) -> tuple[int, Lease]:
    """Take the Connection's budget, then fence, guard and record (one statement, `_RECORD`) in
    ONE transaction; returns the attempt id and the slot's lease. Raises a Rejected (or
    `budget.SlotsBusy`).

    `take` (the shared budget's) runs first: a refusal rolls back before anything is written,
    and a recorded attempt always holds a slot and a permit (they commit together).
    The fence is raised here, in the attempt's transaction, for a request the gates admitted:
    a newer token that arrived meanwhile (while this request waited for a slot) wins. A refusal
    from here rolls it back, and the caller raises it on its own (`raise_fence`) before
    answering.
    """
    async with pool.acquire() as conn, conn.transaction():
        lease = await take(conn)
        guarded = settings.enforce_submission_guard
        # Money could move twice if a payout were forwarded twice (a retry, a second worker, an
        # ambiguous attempt resubmitted: FR-18, FR-23). The statement's guard gives a clear
        # answer; the partial unique index attempts_one_live_per_payout makes it race-free.
        try:
            row = await conn.fetchrow(
                _RECORD_FENCED if settings.enforce_fencing else _RECORD_UNCHECKED,
                req.payout_id,
                req.account_id,
                req.amount,
                req.client_reference,
                req.token,
                req.context.correlation_id,
                req.context.causation_id,
                req.context.deadline_at,
                settings.adapter_version,
                settings.contract_version,
                settings.connection_id,
                settings.enforce_fencing,
                not guarded,
                settings.replica_id,
                guarded,
            )
        except asyncpg.UniqueViolationError as exc:
            raise _duplicate(req) from exc
        if row["high_token"] is None:
            raise _stale(req, await conn.fetchval(_HIGH, req.account_id))
        if row["live"]:
            raise _duplicate(req)
        if row["attempt_id"] is None:
            raise DeadlineExceeded("the deadline passed before the attempt could be recorded")
        return int(row["attempt_id"]), lease


def _duplicate(req: SubmitRequest) -> DuplicateSubmission:
    return DuplicateSubmission(
        f"payout {req.payout_id} already has an attempt that may have reached the rail",
        presented_token=req.token,
    )


async def record_outcome(
    pool: asyncpg.Pool,
    attempt_id: int,
    outcome: Outcome,
    *,
    rail_status: str | None,
    rail_movement_id: str | None,
    error_class: str | None,
    release: tuple[str, str, int, uuid.UUID],
) -> None:
    """Idempotent (only an in-flight attempt is updated, only the lease's own slot is freed),
    so a bounded retry of it is safe. `release`: `SharedBudget.release_args` of its slot."""
    await pool.execute(
        _OUTCOME_RELEASING,
        attempt_id,
        outcome.value,
        rail_status,
        rail_movement_id,
        error_class,
        *release,
    )


async def get_attempts(pool: asyncpg.Pool, payout_id: str) -> list[AttemptRecord]:
    rows = await pool.fetch(
        f"SELECT * FROM {S}.attempts WHERE payout_id = $1 ORDER BY attempt_id", payout_id
    )
    return [AttemptRecord.model_validate(_row(r)) for r in rows]


async def get_attempts_by_reference(
    pool: asyncpg.Pool, client_reference: str
) -> list[AttemptRecord]:
    """Every attempt that carried this client reference (index attempts_by_reference)."""
    rows = await pool.fetch(
        f"SELECT * FROM {S}.attempts WHERE client_reference = $1 ORDER BY attempt_id",
        client_reference,
    )
    return [AttemptRecord.model_validate(_row(r)) for r in rows]


def _row(record: Any) -> dict[str, Any]:
    return dict(record.items())
