"""The submit path of the rail proxy: gates, fenced recording, one forward, recorded outcome.

Order matters and is the safety argument:
0. the grant's signature first (INV-07): a grant the lock service did not issue for this
   account's key and this token is refused as INVALID_GRANT -- nothing forwarded, no attempt
   recorded, the high-water mark untouched (a made-up token could otherwise raise the mark above
   anything the lock service can issue). A genuine grant expired by its own `expires_at` is
   refused too, without touching the mark: as STALE_TOKEN when a newer token is on record (a
   stale holder is always told it is fenced out, as at the payment database), else as
   INVALID_GRANT;
1. the fence: the account's high-water mark is raised to T (T >= mark) or the request is
   refused as STALE_TOKEN (FR-17) before any other refusal is answered -- so a newer holder's
   token is on record even when a gate turns its request away, and an older holder is refused
   by the fence, not only by the attempt guard. A request every gate admits has it raised in its
   attempt's transaction (step 3); a refusal of steps 2 and 3 raises it in its own short
   transaction first (`_fence_on_refusal`), and a lower token is answered STALE_TOKEN instead;
2. gates (deadline budget, rate limit, breaker, bulkhead: this replica's own) reject with no
   attempt recorded: NOT_SUBMITTED;
3. ONE transaction takes the Connection's budget shared by every replica (`railproxy.budget`: a
   slot and a permit; none free, or no answer from the database, and it rolls back before it
   wrote anything: NOT_SUBMITTED), fences the token, guards the payout (FR-18) and records the
   attempt (FR-19) -- committed before any byte goes to the rail;
4. exactly one forward, never retried (UC-05), bounded by min(rail timeout, caller deadline,
   the slot's lease);
5. the outcome is recorded (FR-20); an unrecorded outcome leaves the attempt "in flight", which
   recovery treats as ambiguous -- never as "safe to resubmit". The slot is freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg

from common.backoff import full_jitter
from common.lockkey import lock_key
from common.logs import get_logger
from common.outage import CONNECTION_LOST
from lockservice.verifiers import GrantError, GrantExpired, GrantVerifier, check_not_expired
from railproxy import absence, rail, store
from railproxy.budget import Lease, Limits, SharedBudget
from railproxy.errors import (
    DeadlineExceeded,
    InvalidGrant,
    RailNotReached,
    Rejected,
    StaleToken,
    StoreUnavailable,
)
from railproxy.metrics import ProxyMetrics
from railproxy.models import CERTAINTY_OF, LookupResponse, Outcome, SubmitRequest, SubmitResponse
from railproxy.resilience import Bulkhead, CircuitBreaker, Evidence, TokenBucket, Transition
from railproxy.settings import ProxySettings

# The store failures a submission step answers 503 STORE_UNAVAILABLE (callers retry): an outage
# (common.outage: a lost or closing connection, a pool or command timeout, a connection left
# mid-protocol by a database restart) or a transaction the server rolled back (serialization
# failure, deadlock: safe to run again). Anything else the store raises is a bug (a syntax
# error, a constraint the store does not map itself) and stays a 500, whose certainty the
# client takes as UNKNOWN: loud, and never retried as if it were an outage.
_STORE_ERRORS = (*CONNECTION_LOST, asyncpg.exceptions.TransactionRollbackError)
#: After forwarding, the rail's answer is returned whatever happened to its record: an outcome
#: left unwritten stays in flight, which recovery treats as ambiguous, never as resubmittable.
_OUTCOME_WRITE_ERRORS = (*_STORE_ERRORS, asyncpg.PostgresError)

log = get_logger("railproxy")


_OUTCOME_WRITE_ATTEMPTS = 3


class RailProxy:
    """Runtime state of one proxy process; created in the app's lifespan."""

    def __init__(
        self,
        settings: ProxySettings,
        pool: asyncpg.Pool,
        metrics: ProxyMetrics,
        verifier: GrantVerifier | None,
    ) -> None:
        self.settings = settings
        # None only with RAILPROXY_VERIFY_GRANTS=false, which startup allows in experiment mode.
        self.verifier = verifier
        self.pool = pool
        self.metrics = metrics
        self.submit_http = rail.submit_client(settings)
        self.lookup_http = rail.lookup_client(settings)
        self.breaker = CircuitBreaker(
            window=settings.breaker_window,
            min_samples=settings.breaker_min_samples,
            failure_ratio=settings.breaker_failure_ratio,
            open_s=settings.breaker_open_s,
            on_transition=self._on_transition,
        )
        self.bulkhead = Bulkhead(
            max_concurrency=settings.max_concurrency, max_queue=settings.max_queue
        )
        # This replica's own gates: they turn a flood away before it costs a database round
        # trip, and never admit more than the Connection's budget below would.
        self.bucket = TokenBucket(rate=settings.rate_per_s, burst=settings.rate_burst)
        self.evidence = Evidence(settings.health_window)
        self.rng = random.Random()  # jitter only
        self.submit_budget = self._budget(
            Limits(
                "submit",
                settings.max_concurrency,
                settings.rate_per_s,
                settings.rate_burst,
                settings.rail_timeout_s,
            )
        )
        self.lookup_budget = self._budget(
            Limits(
                "lookup",
                settings.lookup_max_concurrency,
                settings.lookup_rate_per_s,
                settings.lookup_rate_burst,
                settings.lookup_timeout_s,
            )
        )
        self._tasks: set[asyncio.Task[SubmitResponse]] = set()
        metrics.set_circuit(self.breaker.state)

    def _budget(self, limits: Limits) -> SharedBudget:
        return SharedBudget(
            self.pool,
            limits,
            connection_id=self.settings.connection_id,
            replica_id=self.settings.replica_id,
            margin_s=self.settings.budget_lease_margin_s,
            statement_timeout_s=self.settings.budget_timeout_s,
            rng=self.rng,
        )

    async def provision(self) -> None:
        """The rows of the Connection's budgets this replica's limits use (at start-up)."""
        await self.submit_budget.provision()
        await self.lookup_budget.provision()

    async def close(self) -> None:
        if self._tasks:  # let admitted submissions record their outcome before shutdown
            await asyncio.wait(self._tasks, timeout=self.settings.rail_timeout_s + 1)
        await self.submit_http.aclose()
        await self.lookup_http.aclose()

    def _remaining_s(self, req: SubmitRequest) -> float:
        return (req.context.deadline_at - datetime.now(UTC)).total_seconds()

    async def submit(self, req: SubmitRequest) -> SubmitResponse:
        """Raises a `Rejected` (NOT_SUBMITTED) or returns the recorded outcome."""
        self.metrics.requests.inc()
        await self._verify_grant(req)
        async with self._fence_on_refusal(req):
            remaining = self._remaining_s(req)
            if remaining < self.settings.min_useful_budget_s:
                raise DeadlineExceeded(f"only {remaining:.3f}s left before the caller's deadline")
            self.bucket.take()
            self.breaker.check()
        # Once admitted, the work runs in its own task: a caller that disconnects or times out
        # does not cancel a recorded attempt's forward or its outcome write (STD01-06).
        task = asyncio.create_task(self._admitted(req, remaining))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _verify_grant(self, req: SubmitRequest) -> None:
        """Step 0: only a grant the lock service signed for this account and token passes, and
        only before its stated expiry.

        The signature says the lock service issued the token; it does not say the token is the
        newest: a genuine but superseded grant passes here and is refused by the fence next.
        """
        if self.verifier is None:
            return
        grant = None if req.grant is None else req.grant.model_dump()
        key = lock_key(req.account_id)
        try:
            genuine = self.verifier.verify(grant, key=key, token=req.token, check_expiry=False)
        except GrantError as exc:
            raise InvalidGrant(str(exc), reason=exc.code, presented_token=req.token) from None
        try:
            check_not_expired(genuine)
        except GrantExpired as exc:
            # Read-only: an expired grant must not move the mark, even to its own genuine token.
            await self._refuse_if_stale(req)
            raise InvalidGrant(str(exc), reason=exc.code, presented_token=req.token) from None

    async def _refuse_if_stale(self, req: SubmitRequest) -> None:
        """StaleToken if a newer token than the request's is on record (no write)."""
        if not self.settings.enforce_fencing:
            return
        try:
            await store.check_not_stale(self.pool, req)
        except _STORE_ERRORS as exc:
            raise StoreUnavailable(f"could not read the fence: {type(exc).__name__}") from exc

    @contextlib.asynccontextmanager
    async def _fence_on_refusal(self, req: SubmitRequest) -> AsyncIterator[None]:
        """Step 1 for a request refused before its attempt is recorded: a `Rejected` raised in
        the block is answered only once the account's high-water mark has taken T in its own
        transaction (`_raise_fence`); a lower token is answered STALE_TOKEN instead.

        What it prevents: a newer holder T2 whose submit a gate refuses (an open breaker, say)
        would otherwise leave the mark at T1, and the thawed older holder T1 would pass the
        fence, held back from paying a second time only by the per-payout attempt guard.
        An admitted request raises the mark in its attempt's transaction instead (one
        transaction fewer per submit, issue 29); until that commits nothing was forwarded for
        it, so no answer of ours can leave the mark below a token we turned away.
        """
        try:
            yield
        except StaleToken:
            raise  # the fence itself refused it: the mark is above T already
        except Rejected:
            await self._raise_fence(req)
            raise

    async def _raise_fence(self, req: SubmitRequest) -> None:
        """The account's high-water mark takes T in its own short transaction (or StaleToken),
        for a request about to be refused (`_fence_on_refusal`). The rate limit and the breaker
        protect the rail, not our database, whose load is bounded by the pool (`db_pool_max`):
        a flood of refusals waits for a connection instead of opening more.
        """
        try:
            await store.raise_fence(self.pool, req, self.settings)
        except _STORE_ERRORS as exc:
            # Nothing was recorded or forwarded: NOT_SUBMITTED, never a 500.
            raise StoreUnavailable(f"could not raise the fence: {type(exc).__name__}") from exc

    async def _admitted(self, req: SubmitRequest, remaining: float) -> SubmitResponse:
        wait_s = remaining - self.settings.min_useful_budget_s
        queue_until = time.monotonic() + wait_s
        async with contextlib.AsyncExitStack() as slot:
            async with self._fence_on_refusal(req):
                await slot.enter_async_context(self.bulkhead.slot(wait_s=wait_s))
            self.metrics.in_flight.inc()
            try:
                return await self._record_and_forward(req, queue_until)
            finally:
                self.metrics.in_flight.dec()

    async def _record(self, req: SubmitRequest) -> tuple[int, Lease]:
        return await store.record_attempt(self.pool, req, self.settings, self.submit_budget.take)

    async def _record_and_forward(self, req: SubmitRequest, queue_until: float) -> SubmitResponse:
        async with self._fence_on_refusal(req):
            try:
                # What keeps N replicas within the Connection's rate and concurrency: no attempt
                # is recorded (so none forwarded) without a slot and a permit of the shared
                # budget, taken in the attempt's own transaction; a busy slot is waited for until
                # the queue deadline (railproxy.budget). The slot is freed with the outcome write.
                attempt_id, lease = await self.submit_budget.waiting(
                    lambda: self._record(req), wait_s=queue_until - time.monotonic()
                )
            except _STORE_ERRORS as exc:
                # Nothing was forwarded: whether or not the record committed, no byte reached the
                # rail, so this is NOT_SUBMITTED (an uncommitted-looking row that did commit is
                # left in flight, which recovery treats as ambiguous, never as resubmittable).
                raise StoreUnavailable(
                    f"could not record the attempt: {type(exc).__name__}"
                ) from exc
        # The slot's lease bounds the forward too: a forward never outlives the slot it holds.
        budget = min(self.settings.rail_timeout_s, self._remaining_s(req), lease.remaining_s())
        if budget < self.settings.min_useful_budget_s:
            # Recorded but not sent: authoritative NOT_SUBMITTED frees the payout for a new grant.
            await self._write_outcome(
                attempt_id,
                rail.RailAnswer(Outcome.NOT_SUBMITTED, error_class="DeadlineExceeded"),
                lease,
            )
            raise DeadlineExceeded("no useful budget left after recording the attempt")
        log.info(
            "rail.submit",
            replica_id=self.settings.replica_id,
            payout_id=req.payout_id,
            account_id=req.account_id,
            attempt_id=attempt_id,
            token=req.token,
            correlation_id=req.context.correlation_id,
            causation_id=req.context.causation_id,
            budget_s=round(budget, 3),
        )
        started = time.monotonic()
        # The one and only send of this attempt. Nothing retries it: not httpx (retries=0),
        # not this proxy, and a second submit of the payout is refused by the attempt guard.
        answer = await rail.forward(self.submit_http, req, budget, self.settings.connect_timeout_s)
        elapsed = time.monotonic() - started
        self.metrics.latency.observe(elapsed)
        self.evidence.add(elapsed, ok=answer.technical_success, timeout=answer.timed_out)
        self.breaker.record(answer.technical_success)
        await self._write_outcome(attempt_id, answer, lease)
        self.metrics.outcomes.labels(outcome=answer.outcome.value).inc()
        log.info(
            "rail.outcome",
            replica_id=self.settings.replica_id,
            payout_id=req.payout_id,
            attempt_id=attempt_id,
            outcome=answer.outcome.value,
            rail_status=answer.rail_status,
            error_class=answer.error_class,
            handoff_certainty=CERTAINTY_OF[answer.outcome].value,
            correlation_id=req.context.correlation_id,
            elapsed_s=round(elapsed, 3),
        )
        if answer.outcome is Outcome.NOT_SUBMITTED:
            raise RailNotReached(
                f"the rail was not reached ({answer.error_class}); nothing was sent",
                presented_token=req.token,
            )
        return SubmitResponse(
            payout_id=req.payout_id,
            attempt_id=attempt_id,
            outcome=answer.outcome,
            handoff_certainty=CERTAINTY_OF[answer.outcome],
            rail_status=answer.rail_status,
            rail_movement_id=answer.rail_movement_id,
            error_class=answer.error_class,
            token=req.token,
            adapter_version=self.settings.adapter_version,
            contract_version=self.settings.contract_version,
        )

    async def _write_outcome(self, attempt_id: int, answer: rail.RailAnswer, lease: Lease) -> None:
        """Bounded retry: the UPDATE only touches an in-flight attempt, so repeating it is safe.
        It frees the attempt's slot too; if every try fails, the slot's lease runs out."""
        for attempt in range(_OUTCOME_WRITE_ATTEMPTS):
            try:
                await store.record_outcome(
                    self.pool,
                    attempt_id,
                    answer.outcome,
                    rail_status=answer.rail_status,
                    rail_movement_id=answer.rail_movement_id,
                    error_class=answer.error_class,
                    release=self.submit_budget.release_args(lease),
                )
                return
            except _OUTCOME_WRITE_ERRORS as exc:
                log.warning(
                    "rail.outcome_write_failed",
                    attempt_id=attempt_id,
                    error=type(exc).__name__,
                    try_number=attempt + 1,
                )
                await asyncio.sleep(full_jitter(attempt, base_s=0.1, rng=self.rng))
        # Left in flight (outcome NULL): recovery treats it as ambiguous, never as resubmittable.
        log.error("rail.outcome_unrecorded", attempt_id=attempt_id, outcome=answer.outcome.value)

    async def lookup(self, client_reference: str, payout_id: str | None = None) -> LookupResponse:
        """The rail's status for a reference and, for a `not_found`, whether it proves absence.

        The judgement uses this proxy's records (every attempt of the reference, or of the payout
        when given) and the Connection's margins, never the caller's clock.
        """
        try:
            result = await rail.lookup(
                self.lookup_http,
                client_reference,
                budget=self.lookup_budget,
                attempts=self.settings.lookup_attempts,
                base_delay_s=self.settings.lookup_base_delay_s,
                rng=self.rng,
            )
        except Exception:
            self.metrics.lookups.labels(result="unavailable").inc()
            raise
        if result.status == "not_found":
            result = await self._judge_absence(result, payout_id)
        self.metrics.lookups.labels(result="absent" if result.absent else result.status).inc()
        return result

    async def _judge_absence(self, found: LookupResponse, payout_id: str | None) -> LookupResponse:
        # Money could move while our records say it did not if a not_found were taken as absence
        # for an instruction the rail has not ingested yet, or from a window its records do not
        # cover: absence.judge demands the rail's window cover every attempt with both margins.
        try:
            records = await store.get_attempts_by_reference(self.pool, found.client_reference)
        except _STORE_ERRORS as exc:
            return found.model_copy(update={"reason": f"attempts unreadable: {type(exc).__name__}"})
        if payout_id is not None:
            records = [a for a in records if a.payout_id == payout_id]
        verdict = absence.judge(
            records,
            found.complete_from,
            found.complete_through,
            ingest_bound_s=self.settings.absence_ingest_bound_s,
            skew_margin_s=self.settings.absence_clock_skew_margin_s,
        )
        return found.model_copy(update={"absent": verdict.absent, "reason": verdict.reason})

    async def probe_loop(self) -> None:
        """Moves OPEN to HALF_OPEN after the open interval and probes with a read-only call."""
        tick = min(0.1, self.settings.breaker_open_s / 4)
        while True:
            await asyncio.sleep(tick)
            if not self.breaker.probe_due():
                continue
            self.breaker.start_probe()
            # Read-only: a probe can never move money (never a real submission).
            try:
                ok, detail = await rail.probe(
                    self.lookup_http, self.settings.breaker_probe_timeout_s
                )
            except Exception as exc:  # a probe bug must not leave the breaker stuck HALF_OPEN
                ok, detail = False, type(exc).__name__
            self.breaker.probe_result(ok, detail)

    def _on_transition(self, t: Transition) -> None:
        self.metrics.set_circuit(t.to_state)
        log.warning(
            "rail.circuit",
            replica_id=self.settings.replica_id,
            from_state=t.from_state.value,
            to_state=t.to_state.value,
            reason=t.reason,
        )
