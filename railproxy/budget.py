"""The rail Connection's budget, shared by every replica of the proxy (STD01-07/08, issue 26).

Each proxy process has its own breaker, token bucket and bulkhead (`railproxy.resilience`), so
N replicas behind a load balancer would send the rail N times the Connection's rate and
concurrency. The limits that the rail must see are therefore kept in the proxy's own schema
(`railproxy.budget_slots`, migration 002), where every replica takes from the same rows:

* a **slot** (concurrency): taken before a call to the rail, freed when the call is over. At
  most `max_concurrency` slots are busy at once, so at most that many calls are open, whatever
  the number of replicas. A slot is a lease: a replica that dies (SIGKILL, OOM, eviction)
  mid-call frees it when the lease runs out, `call_s + margin_s` after it was taken;
* a **permit** (rate): taken with the slot, busy for `burst / rate` seconds, never freed early.
  Each of the `burst` permits serves at most one call per `burst / rate` seconds, so in any
  window of W seconds at most `burst + rate * W` calls start: the token bucket's bound, on one
  clock (the database's) for every replica.

A slot and a permit are taken in ONE statement, both or neither (`FOR UPDATE SKIP LOCKED`:
takers never queue behind each other's rows, so the take never waits for a lock and never
deadlocks). The cost per submission is one statement and no commit of its own: the take is the
first statement of the transaction that records the attempt (`railproxy.store.record_attempt`),
and the release rides on the outcome write (`record_outcome`); a refused take rolls that
transaction back before it wrote anything. A lookup's try has no transaction to join: it takes
and releases on its own (two single-statement commits).

Fail closed: a call to the rail is made only under a lease. A database that is down or slower
than `statement_timeout_s` refuses the call as `StoreUnavailable` (NOT_SUBMITTED: nothing was
recorded or sent). A take that timed out on our side but committed on the server costs one
slot and one permit until they run out: capacity lost for a while, never a call without budget.

Must never: let a call start without a lease, or run past its lease (`Lease.remaining_s` bounds
the call's timeout); free another taker's slot (release matches the lease id); write any table
but `budget_slots`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, TypeVar

import asyncpg

from common.logs import get_logger
from common.outage import CONNECTION_LOST
from railproxy.errors import AdmissionFull, RateLimited, StoreUnavailable

log = get_logger("railproxy")

Budget = Literal["submit", "lookup"]
T = TypeVar("T")

S = "railproxy"
_STORE_ERRORS = (*CONNECTION_LOST, asyncpg.exceptions.TransactionRollbackError)

# Every unit of the budget this replica's settings use; other replicas' larger settings add
# rows this one never takes (a take stays below its own limits).
_PROVISION = f"""
INSERT INTO {S}.budget_slots (connection_id, budget, kind, slot)
SELECT $1, $2, k.kind, s.n
FROM (VALUES ('concurrency', $3::int), ('rate', $4::int)) AS k (kind, size),
     LATERAL generate_series(0, k.size - 1) AS s (n)
ON CONFLICT DO NOTHING
"""
# A free slot and a free permit, both or neither. SKIP LOCKED: a row another taker is taking
# right now is passed over, never waited for (at worst a take finds nothing while the last free
# row is being taken by someone else: a refusal, never an over-commit). clock_timestamp() read
# once (`clock`), not now(): the statement's own instant, the same clock for every replica.
_TAKE = f"""
WITH clock AS (
    SELECT clock_timestamp() AS now
), slot AS (
    SELECT slot FROM {S}.budget_slots
    WHERE connection_id = $1 AND budget = $2 AND kind = 'concurrency' AND slot < $3
      AND busy_until <= (SELECT now FROM clock)
    ORDER BY slot LIMIT 1
    FOR UPDATE SKIP LOCKED
), permit AS (
    SELECT slot FROM {S}.budget_slots
    WHERE connection_id = $1 AND budget = $2 AND kind = 'rate' AND slot < $4
      AND busy_until <= (SELECT now FROM clock)
    ORDER BY slot LIMIT 1
    FOR UPDATE SKIP LOCKED
), pick AS (
    SELECT 'concurrency' AS kind, slot FROM slot
    UNION ALL
    SELECT 'rate' AS kind, slot FROM permit
), taken AS (
    UPDATE {S}.budget_slots AS b SET
        busy_until = clock.now + make_interval(
            secs => CASE WHEN b.kind = 'concurrency' THEN $5::float8 ELSE $6::float8 END),
        lease_id = CASE WHEN b.kind = 'concurrency' THEN $7::uuid END,
        holder = $8,
        taken_at = clock.now
    FROM pick, clock
    WHERE b.connection_id = $1 AND b.budget = $2 AND b.kind = pick.kind AND b.slot = pick.slot
      AND EXISTS (SELECT FROM slot) AND EXISTS (SELECT FROM permit)
    RETURNING b.kind, b.slot
)
SELECT (SELECT slot FROM taken WHERE kind = 'concurrency') AS slot,
       EXISTS (SELECT FROM slot) AS slot_free,
       EXISTS (SELECT FROM permit) AS permit_free
"""


# Only the lease's own taker frees a slot: after a lease ran out and another replica took the
# slot, a late release matches no row.
def release_sql(first: int = 1) -> str:
    """The release statement, its four parameters (`SharedBudget.release_args`) numbered from
    `first`: a statement that frees the slot along with its own work puts its own first."""
    connection, budget, slot, lease = (f"${first + i}" for i in range(4))
    return (
        f"UPDATE {S}.budget_slots SET busy_until = '-infinity', lease_id = NULL"
        f" WHERE connection_id = {connection} AND budget = {budget} AND kind = 'concurrency'"
        f" AND slot = {slot} AND lease_id = {lease}"
    )


RELEASE = release_sql()

#: Polling for a busy slot: the first wait, and the cap of the doubling (full jitter below it).
_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.25


class SlotsBusy(Exception):
    """Every slot of the budget is busy right now (internal: `waiting` polls, then refuses)."""

    def __init__(self, slots: int) -> None:
        super().__init__(f"all {slots} slots busy")
        self.slots = slots


@dataclass(frozen=True)
class Limits:
    """One budget of the Connection, as this replica is configured (every replica the same)."""

    budget: Budget
    max_concurrency: int
    rate_per_s: float
    burst: int
    #: The longest call the budget covers (the forward's or the lookup's timeout).
    call_s: float

    @property
    def permit_s(self) -> float:
        """How long a permit stays busy: `burst` permits per `burst / rate` seconds is `rate`."""
        return self.burst / self.rate_per_s


@dataclass(frozen=True)
class Lease:
    """A slot held for one call. The call must be over by `call_by` (this process's monotonic
    clock); the database frees the slot `margin_s` after that at the earliest."""

    budget: Budget
    slot: int
    lease_id: uuid.UUID
    call_by: float

    def remaining_s(self) -> float:
        return self.call_by - time.monotonic()


class SharedBudget:
    """The Connection's budget for one kind of call (submit or lookup), in PostgreSQL."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        limits: Limits,
        *,
        connection_id: str,
        replica_id: str,
        margin_s: float,
        statement_timeout_s: float,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.limits = limits
        self.connection_id = connection_id
        self.replica_id = replica_id
        self.margin_s = margin_s
        self.statement_timeout_s = statement_timeout_s
        self.rng = rng or random.Random()  # jitter only

    async def provision(self) -> None:
        """Make the rows this replica's limits use (idempotent; every replica at start-up)."""
        lim = self.limits
        await self.pool.execute(
            _PROVISION, self.connection_id, lim.budget, lim.max_concurrency, lim.burst
        )

    async def take(self, conn: asyncpg.Connection) -> Lease:
        """Take a slot and a permit on `conn`: inside the caller's transaction (the submission's
        attempt record: they commit or roll back with it) or alone. `RateLimited` if no permit
        is free, `SlotsBusy` if no slot is; database errors propagate (the caller's outage).

        The statement is bounded by `statement_timeout_s`: a slow database refuses the call
        instead of delaying it (fail closed)."""
        lim = self.limits
        lease_id = uuid.uuid4()
        # Read before the statement is sent: the database's lease starts later than this, so a
        # call that ends by started + call_s ends inside it, with the margin to spare.
        started = time.monotonic()
        row = await conn.fetchrow(
            _TAKE,
            self.connection_id,
            lim.budget,
            lim.max_concurrency,
            lim.burst,
            lim.call_s + self.margin_s,
            lim.permit_s,
            lease_id,
            self.replica_id,
            timeout=self.statement_timeout_s,
        )
        if row["slot"] is not None:
            return Lease(lim.budget, int(row["slot"]), lease_id, started + lim.call_s)
        if not row["permit_free"]:
            raise RateLimited(
                f"the Connection's {lim.budget} rate ({lim.rate_per_s:g}/s, burst "
                f"{lim.burst}) is used up across every replica"
            )
        raise SlotsBusy(lim.max_concurrency)

    async def waiting(self, attempt: Callable[[], Awaitable[T]], wait_s: float) -> T:
        """Run `attempt` (which takes a slot) until it does not raise `SlotsBusy`, polling with
        full jitter for at most `wait_s`; then `AdmissionFull`. The number of replicas' callers
        polling at once is bounded by their bulkheads."""
        deadline = time.monotonic() + wait_s
        delay = _POLL_FIRST_S
        while True:
            try:
                return await attempt()
            except SlotsBusy as busy:
                pause = self.rng.uniform(0, delay)
                if time.monotonic() + pause >= deadline:
                    raise AdmissionFull(
                        f"all {busy.slots} {self.limits.budget} slots of the Connection are "
                        "busy across every replica"
                    ) from None
            await asyncio.sleep(pause)
            delay = min(delay * 2, _POLL_MAX_S)

    @asynccontextmanager
    async def lease(self, wait_s: float) -> AsyncIterator[Lease]:
        """A slot and a permit taken on their own (a lookup's try), released however the call
        ends. Every refusal sends nothing: `RateLimited`, `AdmissionFull` after `wait_s`, and
        `StoreUnavailable` for a database that is down or slower than `statement_timeout_s`."""
        held = await self.acquire(wait_s)
        try:
            yield held
        finally:
            await self.release(held)

    async def acquire(self, wait_s: float) -> Lease:
        """A slot and a permit taken on their own; the caller must `release` it (see `lease`)."""
        return await self.waiting(self._take_alone, wait_s)

    async def _take_alone(self) -> Lease:
        try:
            async with self.pool.acquire(timeout=self.statement_timeout_s) as conn:
                return await self.take(conn)
        except _STORE_ERRORS as exc:
            # Fail closed: without a lease nothing is sent. If the take committed although we
            # timed out, its slot and permit stay busy until they run out: capacity, not money.
            raise StoreUnavailable(
                f"the Connection's {self.limits.budget} budget is unreadable: {type(exc).__name__}"
            ) from exc

    def release_args(self, lease: Lease) -> tuple[str, str, int, uuid.UUID]:
        """The arguments of `RELEASE` (in order), for a statement that frees the slot with its
        own work (the submission's outcome write, `railproxy.store.record_outcome`)."""
        return (self.connection_id, lease.budget, lease.slot, lease.lease_id)

    async def release(self, lease: Lease) -> None:
        """Free the slot now; never raises (an unreleased slot frees itself when it runs out)."""
        try:
            async with self.pool.acquire(timeout=self.statement_timeout_s) as conn:
                await conn.execute(
                    RELEASE, *self.release_args(lease), timeout=self.statement_timeout_s
                )
        except (*_STORE_ERRORS, asyncpg.PostgresError) as exc:
            log.warning(
                "rail.budget_release_failed",
                budget=lease.budget,
                slot=lease.slot,
                replica_id=self.replica_id,
                error=type(exc).__name__,
            )
