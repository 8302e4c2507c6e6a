"""Outbox delivery vocabulary (docs/outbox.md), settings, backoff and the downstream HTTP client.

Pure parts (classification, backoff) live here so they can be unit-tested without a database;
`outbox.publisher` drives them against PostgreSQL and `outbox.ops` holds the SQL.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import random
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import httpx
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common import tracing
from common.backoff import full_jitter
from common.credentials import auth_headers
from common.tls import ClientTLS, ServerTLS


class OutboxError(Exception):
    """Base of the outbox publisher's errors. `code` is a stable machine-readable name."""

    code = "outbox_error"


class NotActionable(OutboxError):
    """An operator action names a row that is not in a state the action applies to."""

    code = "outbox_not_actionable"


class Status(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    CONFLICT_BLOCKED = "conflict_blocked"  # held for an operator, never retried automatically
    DELIVERY_FAILED = "delivery_failed"  # dead letter
    DISCARDED = "discarded"  # an operator decided it must not be delivered


class Outcome(enum.StrEnum):
    """The classification of ONE delivery attempt (the outbox requirement's vocabulary + the
    permanent case)."""

    COMPLETED = "completed"
    DUPLICATE_COMPLETED = "duplicate_completed"
    RETRYABLE_FAILURE = "retryable_failure"
    CONFLICT_BLOCKED = "conflict_blocked"
    PERMANENT_FAILURE = "permanent_failure"


#: Statuses an operator may send back to pending (retry) or to discarded.
OPERABLE = (Status.CONFLICT_BLOCKED, Status.DELIVERY_FAILED)


def _default_publisher_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class OutboxSettings(ServerTLS, ClientTLS, BaseSettings):
    """Publisher settings, env prefix `OUTBOX_` (e.g. `OUTBOX_BASE_DELAY_S`)."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore")

    finledger_url: str = "http://127.0.0.1:8730"
    #: This publisher's bearer token for the finance ledger (component `outbox`,
    #: common.credentials): a file holding it (`OUTBOX_TOKEN_FILE`), never the token in source.
    token_file: str | None = None
    #: The operator digests `payouts outbox retry|discard` checks the operator's token against
    #: (common.credentials; `OUTBOX_CREDENTIALS_PATH`): without it those commands refuse.
    credentials_path: str | None = None
    # Retry policy (STD01-07: bounded, exponential, full jitter).
    base_delay_s: float = Field(default=1.0, gt=0)
    max_delay_s: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=10, ge=1)
    # Wake-up: LISTEN/NOTIFY, plus a poll in case a notification is missed or a backoff ends.
    poll_interval_s: float = Field(default=2.0, gt=0)
    #: The backlog gauges are refreshed at most this often (and at least once per wake-up after
    #: it has passed), not after every delivery cycle: a burst wakes the publisher per commit.
    metrics_interval_s: float = Field(default=2.0, gt=0)
    #: After a NOTIFY wakes it, the publisher waits this long before its delivery cycle, so that
    #: the commits of the next few milliseconds go in the same batch (one claim, one HTTP
    #: request, one outcome UPDATE for all of them) instead of a cycle per commit, and the
    #: cycle runs after, not during, the hot path's next lock hand-off (docs/outbox.md). Adds at
    #: most this much to each event's delivery; 0: a cycle per wake-up, as before.
    linger_s: float = Field(default=0.05, ge=0, le=5.0)
    batch_size: int = Field(default=20, ge=1, le=1000)  # also the per-publisher concurrency bound
    http_timeout_s: float = Field(default=5.0, gt=0)
    # A claim lasts this long; it must outlive one HTTP call by a wide margin, or a live
    # publisher's row could be reclaimed (and sent twice at the same time) while in flight.
    lease_s: float = Field(default=30.0, gt=0)
    publisher_id: str = Field(default_factory=_default_publisher_id, min_length=1)
    metrics_port: int = Field(default=0, ge=0, le=65535)  # 0: no metrics endpoint
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.max_delay_s < self.base_delay_s:
            raise ValueError("max_delay_s must be >= base_delay_s")
        if self.lease_s < 2 * self.http_timeout_s:
            raise ValueError("lease_s must be at least twice http_timeout_s")
        return self


def backoff_delay(attempt: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))] after the attempt-th failure."""
    return full_jitter(attempt - 1, base_s=base_s, cap_s=cap_s, rng=rng)


def classify_status(status_code: int) -> Outcome:
    """Map the ledger's answer to an outcome. 408/429/5xx are transient; other 4xx permanent."""
    if status_code == 201:
        return Outcome.COMPLETED
    if status_code == 200:
        return Outcome.DUPLICATE_COMPLETED
    if status_code == 409:
        return Outcome.CONFLICT_BLOCKED
    # 401/403: our credential was refused before the ledger looked at the record: a
    # configuration fault to fix, never a reason to dead-letter the record at once.
    if status_code in (401, 403, 408, 425, 429) or status_code >= 500:
        return Outcome.RETRYABLE_FAILURE
    return Outcome.PERMANENT_FAILURE


@dataclass(frozen=True)
class Attempt:
    outcome: Outcome
    error: str | None = None


class DownstreamClient:
    """HTTP client of the finance ledger. Every transport error is a retryable failure: the
    ledger deduplicates by correlation id, so sending the same record again is safe."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        token: str | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=auth_headers(token), verify=verify
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(
        self,
        delivery_key: str,
        record: dict[str, Any],
        trace_context: Mapping[str, str | None] | None = None,
    ) -> Attempt:
        """One record alone; `trace_context` (its delivery's span) goes as `traceparent`."""
        try:
            with tracing.attached(trace_context or {}):
                response = await self._client.put(f"/v1/records/{delivery_key}", json=record)
        except httpx.HTTPError as exc:
            return Attempt(Outcome.RETRYABLE_FAILURE, f"{type(exc).__name__}: {exc}"[:500])
        outcome = classify_status(response.status_code)
        error = None if response.is_success else f"HTTP {response.status_code} {response.text}"
        return Attempt(outcome, error[:500] if error else None)

    async def send_batch(
        self,
        items: Sequence[tuple[str, dict[str, Any]]],
        trace_contexts: Sequence[Mapping[str, str]] | None = None,
    ) -> list[Attempt]:
        """Send (delivery key, record) pairs in ONE request; one attempt per item, in order.
        `trace_contexts` (one per item, common.tracing.carrier) travel in the items, beside
        their keys: one request carries items of several payouts' traces.

        A lost reply (timeout, dropped connection, 5xx, 401/403) is a retryable failure of every
        item: the ledger books each key at most once, so resending the whole batch is safe. A
        batch refused as a whole for what it is (another 4xx: an item it cannot parse, a ledger
        without the batch route) is sent item by item instead, so that only the item at fault
        is classified permanent and nothing else is dead-lettered with it.
        """
        contexts = list(trace_contexts) if trace_contexts is not None else [{} for _ in items]
        body = {
            "records": [
                {"correlation_id": key, **record, **ctx}
                for (key, record), ctx in zip(items, contexts, strict=True)
            ]
        }
        try:
            response = await self._client.post("/v1/records:batch", json=body)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            return [Attempt(Outcome.RETRYABLE_FAILURE, error) for _ in items]
        if response.status_code != 200:
            if classify_status(response.status_code) is Outcome.PERMANENT_FAILURE:
                singles = (self.send(k, r, c) for (k, r), c in zip(items, contexts, strict=True))
                return list(await asyncio.gather(*singles))
            error = f"HTTP {response.status_code} {response.text}"[:500]
            return [Attempt(Outcome.RETRYABLE_FAILURE, error) for _ in items]
        try:
            results = response.json()["results"]
            keys = [str(r["correlation_id"]) for r in results]
            statuses = [int(r["status"]) for r in results]
        except (ValueError, KeyError, TypeError) as exc:
            error = f"unreadable batch answer: {type(exc).__name__}: {exc}"[:500]
            return [Attempt(Outcome.RETRYABLE_FAILURE, error) for _ in items]
        if keys != [key for key, _ in items]:
            error = "batch answer does not match the request's items"
            return [Attempt(Outcome.RETRYABLE_FAILURE, error) for _ in items]
        attempts = []
        for result, status in zip(results, statuses, strict=True):
            outcome = classify_status(status)
            ok = 200 <= status < 300
            attempts.append(
                Attempt(outcome, None if ok else f"HTTP {status} {json.dumps(result)}"[:500])
            )
        return attempts

    async def record_count(self) -> int:
        """How many records the ledger holds (for `make demo` and tests)."""
        response = await self._client.get("/v1/count")
        response.raise_for_status()
        return int(response.json()["count"])
