"""The ledger's book (records keyed by correlation id) and its request history (test evidence)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

WriteResult = Literal["created", "duplicate", "conflict"]


def fingerprint(event_type: str, account_id: str, contract_version: str, payload: Any) -> str:
    """What "same content" means: the material fields, canonically serialised. Delivery
    metadata (event id, attempt, publisher) is not content: a redelivery must match."""
    canonical = json.dumps(
        [event_type, account_id, contract_version, payload], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class Record:
    correlation_id: str
    event_id: str
    event_type: str
    account_id: str
    occurred_at: str
    contract_version: str
    payload: Any
    fingerprint: str
    seq: int  # arrival order in this ledger
    recorded_at: str


@dataclass
class RequestEntry:
    correlation_id: str
    started: int  # logical clock ticks: a history, never wall-clock timings
    finished: int | None = None
    answer: str | None = None
    batch: int | None = None  # which batch request carried it (None: a single write)


@dataclass
class Book:
    records: dict[str, Record] = field(default_factory=dict)
    history: list[RequestEntry] = field(default_factory=list)
    _clock: int = 0
    _batches: int = 0

    def clear(self) -> None:
        self.records.clear()
        self.history.clear()
        self._clock = 0
        self._batches = 0

    def next_batch(self) -> int:
        self._batches += 1
        return self._batches

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    def begin(self, correlation_id: str, *, batch: int | None = None) -> RequestEntry:
        entry = RequestEntry(correlation_id=correlation_id, started=self.tick(), batch=batch)
        self.history.append(entry)
        return entry

    def end(self, entry: RequestEntry, answer: str) -> None:
        entry.finished = self.tick()
        entry.answer = answer

    def write(
        self,
        correlation_id: str,
        *,
        event_id: str,
        event_type: str,
        account_id: str,
        occurred_at: str,
        contract_version: str,
        payload: Any,
    ) -> tuple[WriteResult, Record]:
        """Record once per correlation id. The check and the insert run without an await in
        between, so two concurrent writes of one id cannot both create (single event loop)."""
        fp = fingerprint(event_type, account_id, contract_version, payload)
        existing = self.records.get(correlation_id)
        if existing is not None:
            return ("duplicate" if existing.fingerprint == fp else "conflict"), existing
        record = Record(
            correlation_id=correlation_id,
            event_id=event_id,
            event_type=event_type,
            account_id=account_id,
            occurred_at=occurred_at,
            contract_version=contract_version,
            payload=payload,
            fingerprint=fp,
            seq=len(self.records) + 1,
            recorded_at=datetime.now(UTC).isoformat(),
        )
        self.records[correlation_id] = record
        return "created", record

    def snapshot(self, account_id: str | None = None) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records.values() if account_id in (None, r.account_id)]

    def requests(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.history]
