"""The stub's durable movement log: what reached the rail, and what a lookup may see of it.

A real rail keeps its records, so the log is a SQLite file (`RAILSTUB_MOVEMENTS_PATH`) that a
restarted stub reopens; without a path it is an in-memory database that lives as long as the
process. Either way the log knows since when it holds every record (`records_since`: the file's
creation or the last reset, the process start for the in-memory one), and the stub never states
completeness for an earlier time.

Times are wall-clock UTC epoch seconds, so they mean the same after a restart. They are the
stub's true times; the app adds its `clock_skew_s` when it reports them, as a rail whose clock is
off would.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["settled", "pending", "declined"]
LookupStatus = Literal["settled", "pending", "declined", "not_found"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS log_meta (
    key   TEXT PRIMARY KEY,
    value REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS movements (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    movement_id      TEXT NOT NULL UNIQUE,
    client_reference TEXT NOT NULL,
    account_id       TEXT NOT NULL,
    amount           INTEGER NOT NULL,
    declined         INTEGER NOT NULL,
    recorded_at      REAL NOT NULL,
    settles_at       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS movements_by_reference ON movements (client_reference);
"""
_COLUMNS = "movement_id, client_reference, account_id, amount, declined, recorded_at, settles_at"


@dataclass(frozen=True)
class Movement:
    """One instruction the rail received. Declined ones are kept (the lookup must report them)."""

    movement_id: str
    client_reference: str
    account_id: str
    amount: int
    declined: bool
    recorded_at: float  # wall-clock epoch seconds: when the rail received the instruction
    settles_at: float  # when it stops being pending: receipt + latency (+ completion delay)

    def status(self, now: float) -> Status:
        if now < self.settles_at:
            return "pending"
        return "declined" if self.declined else "settled"


class MovementLog:
    """Append-only log. Non-idempotent on purpose: the same reference twice is two movements."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        if path is None:
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            # WAL: lookups and admin reads never block the writer. synchronous=FULL: a movement
            # is on disk before the stub answers anything about it, so not even an OS crash can
            # make the restarted rail forget money it moved (NORMAL would survive a killed
            # process but not a power loss, and the log's completeness statement would be false).
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        # A new log (new file, or the in-memory one of this process) holds every record from now.
        self._db.execute(
            "INSERT OR IGNORE INTO log_meta (key, value) VALUES ('records_since', ?)",
            (time.time(),),
        )
        self.lookups = 0

    @property
    def records_since(self) -> float:
        """Since when (epoch seconds) the log holds every instruction the rail received."""
        with self._lock:
            row = self._db.execute(
                "SELECT value FROM log_meta WHERE key = 'records_since'"
            ).fetchone()
        return float(row[0])

    def record(
        self,
        *,
        client_reference: str,
        account_id: str,
        amount: int,
        declined: bool,
        pending_s: float = 0.0,
    ) -> Movement:
        """Record an instruction at receipt; it stays pending for `pending_s` (latency, delay)."""
        now = time.time()
        movement = Movement(
            movement_id=uuid.uuid4().hex,
            client_reference=client_reference,
            account_id=account_id,
            amount=amount,
            declined=declined,
            recorded_at=now,
            settles_at=now + pending_s,
        )
        with self._lock:
            self._db.execute(
                f"INSERT INTO movements ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    movement.movement_id,
                    client_reference,
                    account_id,
                    amount,
                    int(declined),
                    movement.recorded_at,
                    movement.settles_at,
                ),
            )
        return movement

    def _select(self, client_reference: str | None) -> list[Movement]:
        query = f"SELECT {_COLUMNS} FROM movements"
        args: tuple[str, ...] = ()
        if client_reference is not None:
            query += " WHERE client_reference = ?"
            args = (client_reference,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY seq", args).fetchall()
        return [Movement(r[0], r[1], r[2], int(r[3]), bool(r[4]), r[5], r[6]) for r in rows]

    def lookup(self, client_reference: str, visibility_delay_s: float, now: float) -> LookupStatus:
        """Read-only and eventually consistent (A-08): recent movements are not yet visible."""
        self.lookups += 1
        seen = [
            m.status(now)
            for m in self._select(client_reference)
            if now >= m.recorded_at + visibility_delay_s
        ]
        order: tuple[Status, ...] = ("settled", "pending", "declined")
        return next((status for status in order if status in seen), "not_found")

    def snapshot(self, client_reference: str | None = None) -> list[Movement]:
        return self._select(client_reference)

    def counts(self) -> dict[str, int]:
        """Instructions recorded per client reference (declined included): > 1 is a duplicate."""
        return dict(Counter(m.client_reference for m in self._select(None)))

    def clear(self) -> None:
        """Forget every movement; the log now holds every record only from this instant."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM movements")
            self._db.execute(
                "UPDATE log_meta SET value = ? WHERE key = 'records_since'", (time.time(),)
            )
            self._db.execute("COMMIT")
        self.lookups = 0

    def close(self) -> None:
        with self._lock:
            self._db.close()
