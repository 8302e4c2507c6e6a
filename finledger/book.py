"""The ledger's book (records keyed by correlation id) and its request history (test evidence).

A real ledger keeps its records, so the book is a SQLite file (`FINLEDGER_BOOK_PATH`) that a
restarted ledger reopens, as the rail stub keeps its movement log (railstub/movements.py):
deduplication by correlation id survives a restart, and a redelivery the outbox sends because it
never saw the first answer is answered `duplicate`, never booked a second time. Without a path
both live in in-memory databases for the life of the process (tests).

Durability: a record is on disk before the ledger answers anything about it (WAL,
`synchronous=FULL`: not even an OS crash makes the restarted ledger forget a booking it
acknowledged). The request history is evidence for tests, not money: it is written on a second
connection with `synchronous=NORMAL` (it survives a killed process, not necessarily a power
loss), so that a write costs one fsync, the record's.

Memory is bounded: records and history live in the file, and the process holds only SQLite's
page cache (`CACHE_KIB` per connection, two connections) and the answer being served. The read
endpoints that list everything (`/v1/records`, `/admin/requests`) materialise their answer while
they serve it.

Single event loop: every call runs to completion without an await, under a lock (the app may be
served from another thread than the one that opened the book).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

WriteResult = Literal["created", "duplicate", "conflict"]

#: SQLite's page cache per connection, in KiB (`PRAGMA cache_size = -CACHE_KIB`).
CACHE_KIB = 2048

_BOOK = """
CREATE TABLE IF NOT EXISTS records (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    correlation_id   TEXT NOT NULL UNIQUE,
    event_id         TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    account_id       TEXT NOT NULL,
    occurred_at      TEXT NOT NULL,
    contract_version TEXT NOT NULL,
    payload          TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    recorded_at      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_account ON records (account_id);
"""
_HISTORY = """
CREATE TABLE IF NOT EXISTS requests (
    id             INTEGER PRIMARY KEY,
    correlation_id TEXT NOT NULL,
    started        INTEGER NOT NULL,
    finished       INTEGER,
    answer         TEXT,
    batch          INTEGER
);
"""
_RECORD_COLUMNS = (
    "correlation_id, event_id, event_type, account_id, occurred_at, contract_version, payload,"
    " fingerprint, seq, recorded_at"
)
#: The answer recorded for a request that was in flight when the ledger stopped: its reply never
#: went out (whether it was booked, the book says).
INTERRUPTED = "interrupted"


def fingerprint(event_type: str, account_id: str, contract_version: str, payload: Any) -> str:
    """What "same content" means: the material fields, canonically serialised. Delivery
    metadata (event id, attempt, publisher) is not content: a redelivery must match."""
    canonical = json.dumps(
        [event_type, account_id, contract_version, payload], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _connect(path: Path | None, synchronous: str) -> sqlite3.Connection:
    if path is None:
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
        db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    return db


class Book:
    """Records once per correlation id, and the history of the write requests."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._book = _connect(path, "FULL")
        self._book.executescript(_BOOK)
        # The same file on a second connection (or its own in-memory database).
        self._history = _connect(path, "NORMAL")
        self._history.executescript(_HISTORY)
        row = self._history.execute(
            "SELECT max(max(started), coalesce(max(finished), 0)), max(batch) FROM requests"
        ).fetchone()
        self._clock = int(row[0] or 0)
        self._batches = int(row[1] or 0)
        # Requests in flight when the ledger last stopped never got their reply.
        self._history.execute(
            "UPDATE requests SET finished = ?, answer = ? WHERE finished IS NULL",
            (self._tick(), INTERRUPTED),
        )

    def clear(self) -> None:
        """Empty the book and the history (the test controls' reset)."""
        with self._lock:
            self._book.execute("BEGIN IMMEDIATE")
            self._book.execute("DELETE FROM records")
            self._book.execute("DELETE FROM sqlite_sequence WHERE name = 'records'")
            self._book.execute("COMMIT")
            self._history.execute("DELETE FROM requests")
            self._clock = 0
            self._batches = 0

    def close(self) -> None:
        with self._lock:
            self._book.close()
            self._history.close()

    def next_batch(self) -> int:
        with self._lock:
            self._batches += 1
            return self._batches

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def begin(self, correlation_id: str, *, batch: int | None = None) -> int:
        """Open a history entry (logical clock ticks: a history, never wall-clock timings)."""
        with self._lock:
            cursor = self._history.execute(
                "INSERT INTO requests (correlation_id, started, batch) VALUES (?, ?, ?)",
                (correlation_id, self._tick(), batch),
            )
            return int(cursor.lastrowid or 0)

    def end(self, entry: int, answer: str) -> None:
        with self._lock:
            self._history.execute(
                "UPDATE requests SET finished = ?, answer = ? WHERE id = ?",
                (self._tick(), answer, entry),
            )

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
    ) -> tuple[WriteResult, dict[str, Any]]:
        """Record once per correlation id; returns the result and the record as booked.

        What keeps a posting from being booked twice: the check and the insert run under one
        lock with no await between (one event loop), and the UNIQUE correlation id of the file
        backs it, so neither a concurrent write of the same id nor a redelivery after a restart
        can create a second record."""
        fp = fingerprint(event_type, account_id, contract_version, payload)
        with self._lock:
            existing = self._select("WHERE correlation_id = ?", (correlation_id,))
            if existing:
                found = existing[0]
                return ("duplicate" if found["fingerprint"] == fp else "conflict"), found
            self._book.execute(
                "INSERT INTO records (correlation_id, event_id, event_type, account_id,"
                " occurred_at, contract_version, payload, fingerprint, recorded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    correlation_id,
                    event_id,
                    event_type,
                    account_id,
                    occurred_at,
                    contract_version,
                    json.dumps(payload, sort_keys=True),
                    fp,
                    datetime.now(UTC).isoformat(),
                ),
            )
            return "created", self._select("WHERE correlation_id = ?", (correlation_id,))[0]

    def _select(self, where: str, args: tuple[str, ...]) -> list[dict[str, Any]]:
        rows = self._book.execute(
            f"SELECT {_RECORD_COLUMNS} FROM records {where} ORDER BY seq", args
        ).fetchall()
        names = [c.strip() for c in _RECORD_COLUMNS.split(",")]
        records = [dict(zip(names, row, strict=True)) for row in rows]
        for record in records:
            record["payload"] = json.loads(record["payload"])
        return records

    def snapshot(self, account_id: str | None = None) -> list[dict[str, Any]]:
        """Every record (of one account), in arrival order."""
        with self._lock:
            if account_id is None:
                return self._select("", ())
            return self._select("WHERE account_id = ?", (account_id,))

    def count(self) -> int:
        with self._lock:
            return int(self._book.execute("SELECT count(*) FROM records").fetchone()[0])

    def requests(self) -> list[dict[str, Any]]:
        """The history, oldest first: correlation id, start and finish ticks, answer, batch."""
        with self._lock:
            rows = self._history.execute(
                "SELECT correlation_id, started, finished, answer, batch FROM requests ORDER BY id"
            ).fetchall()
        keys = ("correlation_id", "started", "finished", "answer", "batch")
        return [dict(zip(keys, row, strict=True)) for row in rows]
