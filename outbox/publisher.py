"""The outbox publisher: delivers paydb outbox rows to the finance ledger (issue 8).

Delivery is at least once, deduplicated downstream by the row's delivery key, so the effect is
once. One cycle: claim a batch (short transaction, committed), send the whole batch in ONE HTTP
request with no transaction open (the ledger answers per item), write every item's outcome back
in ONE UPDATE, each row fenced by its claim. Rows are woken by LISTEN/NOTIFY (the insert trigger
of migration 002) with a polling fallback.

Order: NOT guaranteed, not even per account. Rows are claimed oldest first, but the ledger
applies a batch's items concurrently, a failing row backs off while later ones go ahead
(head-of-line protection), and several publishers run at once. Each record carries its
`occurred_at` and event id; the ledger deduplicates by correlation id and finance orders by
`occurred_at`.

Tracing: each row's delivery is a span `outbox.deliver` in the trace the row was staged in (its
stored `traceparent`, common.tracing), from the send to its outcome written back; the batch
request carries each item's context so that the ledger's booking of it joins the same trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import asyncpg
from opentelemetry.trace import Span, SpanKind, StatusCode, use_span
from opentelemetry.trace import Status as SpanStatus

from common import tracing
from common.credentials import read_token
from common.logs import get_logger
from common.outage import CONNECTION_LOST
from outbox.delivery import (
    DownstreamClient,
    OutboxSettings,
    Outcome,
    Status,
    backoff_delay,
)
from outbox.metrics import OutboxMetrics
from outbox.ops import (
    Claimed,
    Verdict,
    backlog_summary,
    claim_batch,
    outbox_summary,
    record_outcomes,
)

__all__ = ["CHANNEL", "Publisher", "next_cycle", "outbox_summary"]

log = get_logger("outbox.publisher")

#: The NOTIFY channel of migration 002's insert trigger.
CHANNEL = "paydb_outbox"

_EVENTS = {
    Outcome.COMPLETED: "outbox.delivered",
    Outcome.DUPLICATE_COMPLETED: "outbox.duplicate",
    Outcome.CONFLICT_BLOCKED: "outbox.conflict_blocked",
}
#: A database error the loop outlives (logged, the next poll tries again): an outage
#: (common.outage, which includes a connection left mid-protocol and a command timeout, both of
#: which used to escape and end the publisher) or any error the server answered.
_DB_ERRORS = (*CONNECTION_LOST, asyncpg.PostgresError)


class Publisher:
    """One publisher; any number may run against one database at once."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: OutboxSettings,
        *,
        metrics: OutboxMetrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._pool = pool
        self.settings = settings
        self.metrics = metrics or OutboxMetrics()
        self._rng = rng or random.Random()
        self._client = DownstreamClient(
            settings.finledger_url,
            timeout_s=settings.http_timeout_s,
            token=read_token(token_file=settings.token_file, what="OUTBOX_TOKEN_FILE"),
            verify=settings.client_verify(),  # the ledger's certificate vs OUTBOX_TLS_CA_FILE
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    # ------------------------------------------------------------------ one cycle

    async def process_once(self) -> list[tuple[Claimed, Outcome]]:
        """Claim one batch of due rows and deliver it; returns each row with its outcome."""
        s = self.settings
        rows = await claim_batch(
            self._pool, publisher_id=s.publisher_id, limit=s.batch_size, lease_s=s.lease_s
        )
        if not rows:
            return []
        spans = [_delivery_span(r) for r in rows]
        try:
            # The claim is committed before the HTTP call: no transaction spans the network.
            # Sending the same record twice cannot book it twice: the ledger keys each item by
            # the row's delivery key (UNIQUE here too), so a resent batch (lost reply, timeout,
            # crash and resend) answers "duplicate" for every item it already booked.
            attempts = await self._client.send_batch(
                [(r.delivery_key, r.record()) for r in rows],
                trace_contexts=[tracing.carrier(span) for span in spans],
            )
            verdicts = []
            for row, attempt in zip(rows, attempts, strict=True):
                status, retry_in_s, reason = self._next_status(row, attempt.outcome)
                verdicts.append(
                    Verdict(row, status, attempt.outcome, attempt.error, retry_in_s, reason)
                )
            written = await record_outcomes(self._pool, verdicts, publisher_id=s.publisher_id)
        except BaseException:
            for span in spans:
                span.end()
            raise
        for v, span in zip(verdicts, spans, strict=True):
            with use_span(span, end_on_exit=True):  # its events carry the payout's trace ids
                self._report(v, written=v.row.event_id in written)
                _end_delivery(span, v)
        return [(v.row, v.outcome) for v in verdicts]

    async def drain(self) -> int:
        """Process batches until one comes back short; returns how many rows were attempted."""
        total = 0
        while True:
            done = await self.process_once()
            total += len(done)
            if len(done) < self.settings.batch_size:
                return total

    async def refresh_metrics(self) -> dict[str, Any]:
        """Set the backlog gauges from the table (`backlog_summary`); returns its figures."""
        summary = await backlog_summary(self._pool)
        self.metrics.observe_summary(summary)
        return summary

    def _report(self, v: Verdict, *, written: bool) -> None:
        """Metrics and the event for one item, once its outcome is committed (or lost)."""
        row, outcome = v.row, v.outcome
        self.metrics.deliveries.labels(outcome=str(outcome)).inc()
        fields = {
            "event_id": str(row.event_id),
            "delivery_key": row.delivery_key,
            "event_type": row.event_type,
            "attempt": row.attempts,
            "outcome": str(outcome),
            "publisher_id": self.settings.publisher_id,
        }
        if not written:
            # Our lease ran out and another publisher owns the row now; its result stands.
            log.warning("outbox.claim_lost", **fields)
        elif v.status is Status.DELIVERY_FAILED:
            log.error("outbox.dead_lettered", reason=v.reason, error=v.error, **fields)
        elif v.status is Status.PENDING:
            log.warning("outbox.retry_scheduled", retry_in_s=v.retry_in_s, error=v.error, **fields)
        else:
            log.info(_EVENTS[outcome], **fields)

    def _next_status(self, row: Claimed, outcome: Outcome) -> tuple[Status, float | None, str]:
        if outcome in (Outcome.COMPLETED, Outcome.DUPLICATE_COMPLETED):
            return Status.DELIVERED, None, ""
        if outcome is Outcome.CONFLICT_BLOCKED:
            return Status.CONFLICT_BLOCKED, None, ""  # never retried automatically
        if outcome is Outcome.PERMANENT_FAILURE:
            return Status.DELIVERY_FAILED, None, "permanent"  # zero retries
        if row.attempts >= self.settings.max_attempts:
            return Status.DELIVERY_FAILED, None, "attempts_exhausted"
        s = self.settings
        delay = backoff_delay(
            row.attempts, base_s=s.base_delay_s, cap_s=s.max_delay_s, rng=self._rng
        )
        return Status.PENDING, delay, ""

    # ------------------------------------------------------------------ the long-running loop

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until `stop` is set; a batch in flight is finished before returning."""
        wake = asyncio.Event()
        listener = asyncio.create_task(self._listen(wake, stop))
        log.info("outbox.publisher_started", publisher_id=self.settings.publisher_id)
        loop = asyncio.get_running_loop()
        refresh_at = loop.time()
        try:
            while not stop.is_set():
                wake.clear()  # before draining: a NOTIFY during the drain wakes the next wait
                try:
                    await self.drain()
                    if loop.time() >= refresh_at:
                        refresh_at = loop.time() + self.settings.metrics_interval_s
                        await self.refresh_metrics()
                except _DB_ERRORS as exc:
                    log.warning("outbox.database_error", error=f"{type(exc).__name__}: {exc}")
                await next_cycle(
                    wake,
                    stop,
                    poll_s=self.settings.poll_interval_s,
                    linger_s=self.settings.linger_s,
                )
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            log.info("outbox.publisher_stopped", publisher_id=self.settings.publisher_id)

    async def _listen(self, wake: asyncio.Event, stop: asyncio.Event) -> None:
        """Hold a LISTEN connection; on loss, reconnect (polling covers the gap)."""

        def notified(*_: object) -> None:
            wake.set()

        while not stop.is_set():
            try:
                async with self._pool.acquire() as conn:
                    lost = asyncio.Event()

                    def terminated(_conn: object, lost: asyncio.Event = lost) -> None:
                        lost.set()

                    conn.add_termination_listener(terminated)
                    await conn.add_listener(CHANNEL, notified)
                    wake.set()  # catch up with rows committed before we listened
                    await _wait_any(lost, stop, within_s=None)
                    conn.remove_termination_listener(terminated)
                    if not conn.is_closed():
                        await conn.remove_listener(CHANNEL, notified)
            except _DB_ERRORS as exc:
                log.warning("outbox.listen_lost", error=f"{type(exc).__name__}: {exc}")
            if not stop.is_set():
                await _wait_any(stop, stop, within_s=self.settings.poll_interval_s)


def _delivery_span(row: Claimed) -> Span:
    """The span of one row's delivery, in the trace it was staged in (none without one)."""
    return tracing.start_continued(
        "outbox.deliver",
        row.trace_context(),
        kind=SpanKind.PRODUCER,
        attributes={
            "outbox.event_id": str(row.event_id),
            "outbox.event_type": row.event_type,
            "outbox.delivery_key": row.delivery_key,
            "outbox.attempt": row.attempts,
        },
    )


def _end_delivery(span: Span, v: Verdict) -> None:
    span.set_attribute("outbox.outcome", str(v.outcome))
    span.set_attribute("outbox.status", str(v.status))
    if v.status is not Status.DELIVERED:
        span.set_status(SpanStatus(StatusCode.ERROR, v.error or str(v.outcome)))


async def next_cycle(
    wake: asyncio.Event, stop: asyncio.Event, *, poll_s: float, linger_s: float
) -> None:
    """Until the next delivery cycle is due: a wake-up (a NOTIFY), `poll_s`, or `stop`. After a
    wake-up, `linger_s` more (unless stopped), so that the commits of those milliseconds join the
    batch (`OutboxSettings.linger_s`); a poll's cycle does not wait: nothing woke it."""
    await _wait_any(wake, stop, within_s=poll_s)
    if wake.is_set() and linger_s > 0:
        await _wait_any(stop, stop, within_s=linger_s)


async def _wait_any(a: asyncio.Event, b: asyncio.Event, *, within_s: float | None) -> None:
    tasks = [asyncio.create_task(a.wait()), asyncio.create_task(b.wait())]
    try:
        await asyncio.wait(tasks, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
