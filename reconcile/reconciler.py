"""The reconciler (UC-07, FR-26): compares payouts, proxy attempts, the rail's movement log and
the ledger over a closed window, classifies every discrepancy, and reports it.

Owns: read-only queries across schemas `paydb` and `railproxy` (only the reconciler and the
invariant checker see across schemas, docs/architecture.md#data-ownership), the
`reconcile.discrepancy` and `reconcile.completed` events and the `reconcile_*` metrics.

Must never: write anything, anywhere. Every query runs in ONE read-only REPEATABLE READ
transaction (one snapshot, and PostgreSQL itself refuses a write in it); it never repairs a break,
never resubmits, never posts. Deployments should also give it a role with SELECT only.

Evidence order matters: the movement log is fetched BEFORE the database snapshot is taken. The
proxy commits an attempt before it forwards (FR-19), so every movement the rail shows us already
has its attempt committed, and our later snapshot sees it: no false movement_without_attempt.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from prometheus_client import Counter, Gauge
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.credentials import operator_token, read_token
from common.logs import get_logger
from common.tls import ClientTLS
from ledger.queries import RAIL_CLEARING, ledger_discrepancies
from railstub.client import (
    MovementLogUnavailable,
    MovementSource,
    RailMovement,
    stub_movement_source,
)
from reconcile.rules import (
    CLASSES,
    AttemptFact,
    Evidence,
    PayoutFact,
    PostingFact,
    Window,
    classify,
)

__all__ = [
    "AMBIGUITY_SLA_S",
    "CLASSES",
    "RAIL_ADMIN_URL",
    "InvalidWindow",
    "MovementSource",
    "MovementSourceUnavailable",
    "RailMovement",
    "ReconcileError",
    "ReconcileReport",
    "ReconcileSettings",
    "Window",
    "WindowNotClosed",
    "component_movement_source",
    "reconcile",
    "reconciler_token",
    "stub_movement_source",
]

log = get_logger("reconcile.reconciler")

DISCREPANCIES = Gauge(
    "reconcile_discrepancies",
    "Discrepancies found by the last reconciliation run, per class.",
    ["discrepancy_class"],
)
RUNS = Counter("reconcile_runs_total", "Reconciliation runs by result.", ["result"])
LAST_COMPLETED = Gauge(
    "reconcile_last_completed_timestamp_seconds",
    "Unix time at which the last reconciliation run completed (alert when it goes stale).",
)


#: Defaults the reconciler's settings share with the worker's (worker.settings.WorkerSettings reads
#: the same RECONCILE_* variables for the ReconcileWorkflow activity it runs).
RAIL_ADMIN_URL = "http://127.0.0.1:8710"
AMBIGUITY_SLA_S = 4 * 3600.0


def reconciler_token(token_file: str | None) -> str | None:
    """The reconciler's bearer token (component `reconciler`) from `RECONCILE_TOKEN_FILE`, else
    (an operator running the command by hand) the operator's. For the command line only: a
    component never falls back to it (`component_movement_source`)."""
    own = read_token(token_file=token_file, what="RECONCILE_TOKEN_FILE")
    return own or operator_token()


def component_movement_source(
    rail_admin_url: str, token_file: str | None, *, verify: ssl.SSLContext | bool = True
) -> MovementSource:
    """The movement log as the worker's reconcile activity reads it: with the `reconciler`
    component's own token (`RECONCILE_TOKEN_FILE`) only, never the operator's (least privilege:
    an operator's token would attribute the worker's reads to a person). Unset, every read fails
    (MovementLogUnavailable, retried by the workflow; another worker may have it) naming the
    variable, and the rail is not called."""
    token = read_token(token_file=token_file, what="RECONCILE_TOKEN_FILE")
    if token is not None:
        return stub_movement_source(rail_admin_url, token=token, verify=verify)

    async def refuse() -> Sequence[RailMovement]:
        raise MovementLogUnavailable(
            "RECONCILE_TOKEN_FILE is not set: this worker reads the rail's movement log only "
            "with the reconciler's own credential; nothing was read"
        )

    return refuse


class ReconcileSettings(ClientTLS, BaseSettings):
    """The reconciler's settings (env prefix RECONCILE_), for the CLI and the worker."""

    model_config = SettingsConfigDict(env_prefix="RECONCILE_")

    rail_admin_url: str = RAIL_ADMIN_URL  # where the rail's movement log is read
    #: The reconciler's bearer token (component `reconciler`) for the rail's movement log: a file
    #: holding it (`RECONCILE_TOKEN_FILE`).
    token_file: str | None = None

    def token(self) -> str | None:
        """Its own token, else (an operator running the command by hand) the operator's."""
        return reconciler_token(self.token_file)

    ambiguity_sla_s: float = AMBIGUITY_SLA_S
    sample_size: int = 10
    window_s: float = 3600.0  # hourly, closed windows
    settle_lag_s: float = 300.0  # a window closes this long after its end
    task_queue: str = "payouts"  # where the Schedule starts ReconcileWorkflow
    #: The reconciler's read-only role (payouts_reconciler); the worker's ReconcileWorkflow
    #: activity uses it, unset: the worker's own DSN (docs/database-roles.md).
    database_url: str | None = None


class ReconcileError(Exception):
    """Base of the reconciler's errors. `code` is a stable machine-readable name."""

    code = "reconcile_error"


class InvalidWindow(ReconcileError):
    """The window is empty, inverted, or has naive datetimes."""

    code = "invalid_window"


class WindowNotClosed(ReconcileError):
    """The window ends after the database's now(): it is still open, results would be noise."""

    code = "window_not_closed"


class MovementSourceUnavailable(ReconcileError):
    """The rail's movement log could not be read; the run reports nothing rather than guess."""

    code = "movement_source_unavailable"


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    window: Window
    counts: dict[str, int]  # all seven classes, always
    samples: dict[str, list[str]]  # at most `sample_size` ids per class, sorted
    checked_payouts: int
    ok: bool


async def reconcile(
    conn: asyncpg.Connection,
    movement_source: MovementSource,
    window: Window,
    *,
    ambiguity_sla: timedelta = timedelta(hours=4),
    sample_size: int = 10,
) -> ReconcileReport:
    """Reconcile one closed window; emit one event per class and a completion event."""
    _check_window(window)
    try:
        movements = await _movements(movement_source)  # before the snapshot: module docstring
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            db_now: datetime = await conn.fetchval("SELECT now()")
            if window.end > db_now:
                raise WindowNotClosed(f"window ends at {window.end}, after now ({db_now})")
            evidence = await _gather(conn, window, movements)
    except ReconcileError:
        RUNS.labels(result="error").inc()
        raise
    findings = classify(evidence, ambiguity_sla=ambiguity_sla, rail_clearing=RAIL_CLEARING)
    report = ReconcileReport(
        window=window,
        counts={c: len(ids) for c, ids in findings.subjects.items()},
        samples={c: ids[:sample_size] for c, ids in findings.subjects.items()},
        checked_payouts=findings.checked_payouts,
        ok=not any(findings.subjects.values()),
    )
    _emit(report)
    return report


async def _movements(source: MovementSource) -> Sequence[RailMovement]:
    try:
        return await source()
    except MovementLogUnavailable as exc:
        raise MovementSourceUnavailable(str(exc)) from exc


def _check_window(window: Window) -> None:
    if window.start.tzinfo is None or window.end.tzinfo is None:
        raise InvalidWindow("window bounds must carry a time zone")
    if window.start >= window.end:
        raise InvalidWindow(f"empty window: {window.start} >= {window.end}")


def _emit(report: ReconcileReport) -> None:
    bounds = {
        "window_start": report.window.start.isoformat(),
        "window_end": report.window.end.isoformat(),
    }
    for cls in CLASSES:
        count = report.counts[cls]
        DISCREPANCIES.labels(discrepancy_class=cls).set(count)
        # One event per class on every run, zeros included: a reconciler that silently stopped
        # finding things is distinguishable from one that found nothing.
        emit = log.warning if count else log.info
        emit(
            "reconcile.discrepancy",
            **{"class": cls},
            count=count,
            sample=report.samples[cls],
            **bounds,
        )
    RUNS.labels(result="ok" if report.ok else "discrepancies").inc()
    LAST_COMPLETED.set(time.time())
    log.info(
        "reconcile.completed",
        counts=report.counts,
        checked_payouts=report.checked_payouts,
        ok=report.ok,
        **bounds,
    )


# ---------------------------------------------------------------------- evidence (read-only SQL)

_PAYOUT_COLUMNS = (
    "p.payout_id, p.account_id, p.amount, p.state, p.client_reference, p.created_at, p.updated_at"
)

# Payouts created in the window, and payouts whose posting group was written in the window.
_SCOPED_PAYOUTS = f"""
SELECT {_PAYOUT_COLUMNS} FROM paydb.payouts p
 WHERE (p.created_at >= $1 AND p.created_at < $2)
    OR EXISTS (SELECT 1 FROM paydb.ledger_groups g
                WHERE g.payout_id = p.payout_id AND g.created_at >= $1 AND g.created_at < $2)
"""
_ATTEMPTS_OF = """
SELECT attempt_id, payout_id, client_reference, outcome FROM railproxy.attempts
 WHERE payout_id = ANY($1::text[]) ORDER BY attempt_id
"""
# Attempts recorded in the window for payouts the payment database has never heard of.
_ORPHAN_ATTEMPTS = """
SELECT a.attempt_id, a.payout_id, a.client_reference, a.outcome FROM railproxy.attempts a
 WHERE a.recorded_at >= $1 AND a.recorded_at < $2
   AND NOT EXISTS (SELECT 1 FROM paydb.payouts p WHERE p.payout_id = a.payout_id)
 ORDER BY a.attempt_id
"""
# Which of the rail's references do we know at all, and is any attempt for them possibly sent?
_KNOWN_REFERENCES = """
SELECT r.ref,
       EXISTS (SELECT 1 FROM paydb.payouts p WHERE p.client_reference = r.ref) AS has_payout,
       EXISTS (SELECT 1 FROM railproxy.attempts a WHERE a.client_reference = r.ref) AS has_any,
       EXISTS (SELECT 1 FROM railproxy.attempts a
                WHERE a.client_reference = r.ref
                  AND a.outcome IS DISTINCT FROM 'NOT_SUBMITTED') AS has_live
  FROM unnest($1::text[]) AS r(ref)
"""
_POSTINGS_OF = """
SELECT g.group_id::text AS group_id, g.payout_id, e.account_id, e.amount
  FROM paydb.ledger_groups g JOIN paydb.ledger_entries e ON e.group_id = g.group_id
 WHERE g.payout_id = ANY($1::text[]) ORDER BY g.group_id, e.entry_id
"""
_AMBIGUOUS_NOW = f"SELECT {_PAYOUT_COLUMNS} FROM paydb.payouts p WHERE p.state = 'RAIL_AMBIGUOUS'"


async def _gather(
    conn: asyncpg.Connection, window: Window, movements: Sequence[RailMovement]
) -> Evidence:
    ev = Evidence(window=window)
    ev.payouts = [_payout(r) for r in await conn.fetch(_SCOPED_PAYOUTS, window.start, window.end)]
    ids = [p.payout_id for p in ev.payouts]
    ev.attempts = [_attempt(r) for r in await conn.fetch(_ATTEMPTS_OF, ids)]
    ev.orphan_attempts = [
        _attempt(r) for r in await conn.fetch(_ORPHAN_ATTEMPTS, window.start, window.end)
    ]
    scoped_refs = {p.client_reference for p in ev.payouts} | {
        a.client_reference for a in ev.orphan_attempts
    }
    refs = sorted({m.client_reference for m in movements})
    known = {r["ref"]: r for r in await conn.fetch(_KNOWN_REFERENCES, refs)}
    for mv in movements:
        k = known[mv.client_reference]
        if mv.client_reference in scoped_refs:
            ev.movements.append(mv)
        elif not k["has_payout"] and not k["has_any"] and _unplaced_in(mv, window):
            ev.movements.append(mv)  # nobody recorded it: it belongs to no one's window
        if k["has_live"]:
            ev.references_with_attempt.add(mv.client_reference)
    postings: dict[str, list[Any]] = {}
    for r in await conn.fetch(_POSTINGS_OF, ids):
        postings.setdefault(r["group_id"], []).append(r)
    ev.postings = [
        PostingFact(
            group_id=gid,
            payout_id=rows[0]["payout_id"],
            entries=tuple((r["account_id"], int(r["amount"])) for r in rows),
        )
        for gid, rows in postings.items()
    ]
    ev.ledger_subjects = [d.subject for d in await ledger_discrepancies(conn)]
    ev.ambiguous = [_payout(r) for r in await conn.fetch(_AMBIGUOUS_NOW)]
    return ev


def _unplaced_in(mv: RailMovement, window: Window) -> bool:
    """A movement nobody recorded is placed by its own timestamp when the rail gives one;
    otherwise (the stub) it is reported in every run until someone explains it."""
    return mv.recorded_at is None or window.start <= mv.recorded_at < window.end


def _payout(r: Any) -> PayoutFact:
    return PayoutFact(
        payout_id=r["payout_id"],
        account_id=r["account_id"],
        amount=int(r["amount"]),
        state=r["state"],
        client_reference=r["client_reference"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


def _attempt(r: Any) -> AttemptFact:
    return AttemptFact(
        attempt_id=int(r["attempt_id"]),
        payout_id=r["payout_id"],
        client_reference=r["client_reference"],
        outcome=r["outcome"],
    )
