"""The invariant checker (INV-01..INV-10, NFR-06, NFR-07).

Computes the ten correctness invariants from five sources of evidence: the payment database
(`paydb`: payouts, balances, audit log, ledger), the rail proxy's records (`railproxy`: attempts,
per-account high-water tokens), the rail's movement log, the lock service's grant history, and
Temporal's record of payout workflows that closed without completing (INV-10; optional).
Each invariant is reported with a count of violations and a bounded sample.

Owns: the evidence queries, the grant-history and workflow sources, the `invariants.checked` and
`invariants.violation` events and the `invariants_*` metrics. The rules are in
`invariants.rules` (pure).

Must never: write anything, anywhere (in Temporal it only lists and describes workflows). The
database evidence is read in ONE read-only REPEATABLE READ transaction (one snapshot; PostgreSQL
itself refuses a write in it), and the PostgreSQL grant source reads in a read-only transaction of
its own. It never repairs, resubmits, revokes, or terminates a workflow.

Evidence order matters:
1. the movement log first (as the reconciler does): the proxy commits an attempt before it
   forwards (FR-19), so every movement we see has its attempt in the later snapshot;
   then the closed payout workflows: a closed run is final, so a payout the later snapshot
   still shows non-terminal was truly left behind by it (INV-10);
2. then the database snapshot;
3. then the grant history: a write in the snapshot was made under a grant acquired before it, so a
   history read AFTER the snapshot contains every grant any write in it presented (no false
   INV-07). Grants acquired after the snapshot only add later intervals, which no rule misreads.

Clocks: write times (audit `at`, attempt `recorded_at`) are PostgreSQL's; grant times come from
the lock backend (PostgreSQL's clock too when it is the same server; the etcd backend stamps with
its lock server's clock). INV-01 and INV-07 compare the two, so run them on one clock in tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import asyncpg
import httpx
from prometheus_client import Counter, Gauge
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.credentials import auth_headers, operator_token, read_token
from common.logs import get_logger
from invariants.rules import (
    INVARIANTS,
    WORKFLOW_ID_PREFIX,
    AttemptRow,
    Evidence,
    GrantFact,
    GrantHistory,
    PayoutRow,
    Transition,
    WorkflowFact,
    Write,
    check,
)
from ledger.queries import ledger_discrepancies
from railstub.client import MovementLogUnavailable, MovementSource, stub_movement_source

__all__ = [
    "INVARIANTS",
    "GrantFact",
    "GrantSource",
    "GrantSourceUnavailable",
    "InvariantError",
    "InvariantReport",
    "InvariantResult",
    "InvariantSettings",
    "MovementsUnavailable",
    "WorkflowFact",
    "WorkflowSource",
    "WorkflowSourceUnavailable",
    "check_invariants",
    "lock_server_grant_source",
    "postgres_grant_source",
    "stub_movement_source",
    "temporal_workflow_source",
]

log = get_logger("invariants.checker")

#: The lock service's grant history, injected (PostgreSQL table, or the lock server over HTTP).
GrantSource = Callable[[], Awaitable[Sequence[GrantFact]]]
#: Payout workflows whose latest run closed without completing (Temporal, or a test's list).
WorkflowSource = Callable[[], Awaitable[Sequence[WorkflowFact]]]

VIOLATIONS = Gauge(
    "invariants_violations", "Violations found by the last invariant check.", ["invariant"]
)
RUNS = Counter("invariants_runs_total", "Invariant checker runs by result.", ["result"])


class InvariantSettings(BaseSettings):
    """The checker's settings (env prefix INVARIANTS_), one object per process."""

    model_config = SettingsConfigDict(env_prefix="INVARIANTS_")

    rail_admin_url: str = "http://127.0.0.1:8710"  # the rail stub's movement log
    lock_url: str = "http://127.0.0.1:8701"  # the lock server (history over HTTP)
    #: The checker's bearer token (component `invariants`) for the stub's movement log and the
    #: lock server's history: a file holding it (`INVARIANTS_TOKEN_FILE`).
    token_file: str | None = None

    def token(self) -> str | None:
        """Its own token, else (an operator running the command by hand) the operator's."""
        own = read_token(token_file=self.token_file, what="INVARIANTS_TOKEN_FILE")
        return own or operator_token()

    history: Literal["postgres", "http"] = "postgres"  # where the grant history is read
    lock_database_url: str | None = None  # lockservice schema's database; default DATABASE_URL
    lock_prefix: str = ""  # the lock backend's namespace prefix (PostgreSQL source)
    sample_size: int = 10


class InvariantError(Exception):
    """Base of the checker's errors. `code` is a stable machine-readable name."""

    code = "invariant_error"


class MovementsUnavailable(InvariantError):
    """The rail's movement log could not be read; nothing is reported rather than a guess."""

    code = "movement_source_unavailable"


class GrantSourceUnavailable(InvariantError):
    """The grant history could not be read completely; nothing is reported rather than a guess."""

    code = "grant_source_unavailable"


class WorkflowSourceUnavailable(InvariantError):
    """Temporal could not be asked about the payout workflows; nothing is reported."""

    code = "workflow_source_unavailable"


@dataclass(frozen=True, slots=True)
class InvariantResult:
    invariant: str  # INV-01 .. INV-10
    title: str
    count: int
    sample: list[str]  # at most `sample_size`, sorted


@dataclass(frozen=True, slots=True)
class InvariantReport:
    results: list[InvariantResult]  # all ten, in order
    checked: dict[str, int]  # how much evidence was looked at, per source
    ok: bool
    #: Rules that had no evidence this run (INV-10 without Temporal, or before settling).
    not_checked: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {r.invariant: r.count for r in self.results}

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "invariants": {
                r.invariant: {"title": r.title, "count": r.count, "sample": r.sample}
                for r in self.results
            },
            "checked": dict(self.checked),
            "not_checked": list(self.not_checked),
        }


# ---------------------------------------------------------------------- grant sources

_HISTORY_SQL = """
SELECT g.id, g.key, g.token, g.acquired_at,
       -- A grant whose session expired while nobody touched its key has no stored end: it ended
       -- at its session's expiry (what the next acquire or close will store, end_grant()).
       coalesce(g.ended_at,
                CASE WHEN s.expires_at <= clock_timestamp() THEN s.expires_at END) AS ended_at
  FROM lockservice.grant_history g
  LEFT JOIN lockservice.sessions s ON g.ended_at IS NULL AND s.session_id = g.session_id
 WHERE starts_with(g.key, $1)
 ORDER BY g.id
"""


def postgres_grant_source(database_url: str, *, backend_prefix: str = "") -> GrantSource:
    """`lockservice.grant_history` read directly (PostgreSQL lock backend), read-only."""

    async def fetch() -> Sequence[GrantFact]:
        try:
            conn = await asyncpg.connect(database_url, timeout=10)
        except (OSError, asyncpg.PostgresError) as exc:
            raise GrantSourceUnavailable(f"grant history unavailable: {exc}") from exc
        try:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                rows = await conn.fetch(_HISTORY_SQL, backend_prefix)
        except asyncpg.PostgresError as exc:
            raise GrantSourceUnavailable(f"grant history unavailable: {exc}") from exc
        finally:
            await conn.close()
        cut = len(backend_prefix)
        return [
            GrantFact(
                key=r["key"][cut:],
                token=int(r["token"]),
                acquired_at=r["acquired_at"],
                ended_at=r["ended_at"],
                seq=int(r["id"]),
            )
            for r in rows
        ]

    return fetch


def lock_server_grant_source(
    base_url: str,
    *,
    key_prefix: str = "",
    limit: int = 100_000,
    timeout_s: float = 30.0,
    transport: httpx.AsyncBaseTransport | None = None,
    token: str | None = None,
) -> GrantSource:
    """The lock server's `GET /v1/history` (either backend). A truncated answer is an error: a
    partial history could hide a repeated token or an overlap."""

    async def fetch() -> Sequence[GrantFact]:
        try:
            async with httpx.AsyncClient(
                base_url=base_url,
                timeout=timeout_s,
                transport=transport,
                headers=auth_headers(token),
            ) as client:
                response = await client.get(
                    "/v1/history", params={"prefix": key_prefix, "limit": limit}
                )
                response.raise_for_status()
                body: dict[str, Any] = response.json()
            if body.get("truncated"):
                raise GrantSourceUnavailable(f"grant history truncated at {limit} grants")
            # The server orders by (key, token); seq keeps that order for equal acquired_at.
            grants = GrantHistory(_grant(i, g) for i, g in enumerate(body["grants"]))
            since = body.get("retained_since")  # etcd retention: the history's horizon
            grants.complete_since = datetime.fromisoformat(since) if since else None
            return grants
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise GrantSourceUnavailable(f"grant history unavailable: {exc}") from exc

    return fetch


def _grant(seq: int, g: dict[str, Any]) -> GrantFact:
    ended = g.get("ended_at")
    return GrantFact(
        key=str(g["key"]),
        token=int(g["token"]),
        acquired_at=datetime.fromisoformat(g["acquired_at"]),
        ended_at=datetime.fromisoformat(ended) if ended else None,
        seq=seq,
    )


# ---------------------------------------------------------------------- workflow source

#: Closed without completing: nothing will run this payout's workflow again (INV-10).
STOPPED_STATUSES = ("Failed", "Terminated", "TimedOut", "Canceled")
_STOPPED_QUERY = (
    'WorkflowType="PayoutWorkflow" AND ('
    + " OR ".join(f'ExecutionStatus="{s}"' for s in STOPPED_STATUSES)
    + ")"
)


def temporal_workflow_source(
    address: str, *, namespace: str = "default", id_prefix: str = WORKFLOW_ID_PREFIX
) -> WorkflowSource:
    """Payout workflows whose LATEST run is failed, terminated, timed out or canceled.

    Visibility lists every closed run; each listed id is then described, which answers for its
    latest run, so a run that continued as new (or was reset) and goes on is not counted."""

    async def fetch() -> Sequence[WorkflowFact]:
        from temporalio.client import Client, WorkflowExecutionStatus
        from temporalio.service import RPCError

        stopped = {
            WorkflowExecutionStatus.FAILED,
            WorkflowExecutionStatus.TERMINATED,
            WorkflowExecutionStatus.TIMED_OUT,
            WorkflowExecutionStatus.CANCELED,
        }
        try:
            client = await Client.connect(address, namespace=namespace)
            ids = {
                wf.id
                async for wf in client.list_workflows(_STOPPED_QUERY)
                if wf.id.startswith(id_prefix)
            }
            out = []
            for wid in sorted(ids):
                desc = await client.get_workflow_handle(wid).describe()
                if desc.status in stopped:
                    out.append(WorkflowFact(workflow_id=wid, status=desc.status.name))
            return out
        except (RPCError, RuntimeError, OSError) as exc:
            raise WorkflowSourceUnavailable(f"Temporal unavailable at {address}: {exc}") from exc

    return fetch


# ---------------------------------------------------------------------- the check


async def check_invariants(
    conn: asyncpg.Connection,
    movement_source: MovementSource,
    grant_source: GrantSource,
    *,
    workflow_source: WorkflowSource | None = None,
    settled: bool = False,
    sample_size: int = 10,
) -> InvariantReport:
    """Check INV-01..INV-10 once; emit `invariants.checked` and one `invariants.violation` per
    violated invariant. Raises an InvariantError when a source is unreadable.

    `workflow_source` None: INV-10's workflow rule is not evaluated (reported in
    `not_checked`). `settled`: the caller knows the system has settled (every payout had its
    chance to finish), so INV-10's "terminal or escalated" rule applies; mid-run it must not."""
    try:
        movements = await movement_source()  # first: see the module docstring
        workflows = None if workflow_source is None else list(await workflow_source())
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            ev = await _gather(conn)
        ev.movements = list(movements)
        ev.workflows, ev.workflows_checked = workflows or [], workflows is not None
        ev.settled = settled
        grants = await grant_source()  # last: see the module docstring
        ev.grants = list(grants)
        ev.grants_complete_since = getattr(grants, "complete_since", None)
    except MovementLogUnavailable as exc:
        RUNS.labels(result="error").inc()
        raise MovementsUnavailable(str(exc)) from exc
    except InvariantError:
        RUNS.labels(result="error").inc()
        raise
    found = check(ev)
    results = [
        InvariantResult(
            invariant=inv,
            title=INVARIANTS[inv],
            count=len(found[inv]),
            sample=found[inv][:sample_size],
        )
        for inv in INVARIANTS
    ]
    report = InvariantReport(
        results=results,
        checked={
            "payouts": len(ev.payouts),
            "writes": len(ev.writes),
            "attempts": len(ev.attempts),
            "movements": len(ev.movements),
            "grants": len(ev.grants),
            "closed_workflows": len(ev.workflows),
            # Attempts and writes older than a pruned history's horizon: INV-07 skips them.
            "before_grant_horizon": _before_horizon(ev),
        },
        ok=not any(r.count for r in results),
        not_checked=_not_checked(ev),
    )
    _emit(report)
    return report


def _before_horizon(ev: Evidence) -> int:
    since = ev.grants_complete_since
    if since is None:
        return 0
    return sum(a.recorded_at < since for a in ev.attempts) + sum(w.at < since for w in ev.writes)


def _not_checked(ev: Evidence) -> list[str]:
    out = []
    if not ev.workflows_checked:
        out.append("INV-10 closed workflows (no Temporal address given)")
    if not ev.settled:
        out.append("INV-10 terminal-or-escalated (the system was not declared settled)")
    return out


def _emit(report: InvariantReport) -> None:
    for r in report.results:
        VIOLATIONS.labels(invariant=r.invariant).set(r.count)
        if r.count:
            # NFR-06: a single violation is an incident-grade signal; alerts filter on the name.
            log.error(
                "invariants.violation",
                invariant=r.invariant,
                title=r.title,
                count=r.count,
                sample=r.sample,
            )
    RUNS.labels(result="ok" if report.ok else "violations").inc()
    log.info(
        "invariants.checked",
        counts=report.counts(),
        checked=report.checked,
        not_checked=report.not_checked,
        ok=report.ok,
    )


_WRITES = """
SELECT audit_id, at, token, action, payout_id, account_id, from_state, to_state
  FROM paydb.audit_log WHERE token IS NOT NULL ORDER BY audit_id
"""
_TRANSITIONS = """
SELECT audit_id, payout_id, from_state, to_state FROM paydb.audit_log
 WHERE payout_id IS NOT NULL AND to_state IS NOT NULL ORDER BY audit_id
"""
_PAYOUTS = "SELECT payout_id, account_id, state, fence, client_reference FROM paydb.payouts"
_BALANCES = "SELECT account_id, fence FROM paydb.balances"
_ATTEMPTS = """
SELECT attempt_id, payout_id, account_id, client_reference, token, outcome, recorded_at
  FROM railproxy.attempts ORDER BY attempt_id
"""
_PROXY_FENCES = "SELECT account_id, high_token FROM railproxy.account_fences"
_ESCALATED = """
SELECT DISTINCT payout_id FROM paydb.audit_log
 WHERE action = 'ambiguity_escalated' AND payout_id IS NOT NULL
"""


async def _gather(conn: asyncpg.Connection) -> Evidence:
    ev = Evidence()
    ev.writes = [Write(**dict(r)) for r in await conn.fetch(_WRITES)]
    ev.transitions = [Transition(**dict(r)) for r in await conn.fetch(_TRANSITIONS)]
    ev.payouts = [PayoutRow(**dict(r)) for r in await conn.fetch(_PAYOUTS)]
    ev.balance_fences = {r["account_id"]: int(r["fence"]) for r in await conn.fetch(_BALANCES)}
    ev.attempts = [AttemptRow(**dict(r)) for r in await conn.fetch(_ATTEMPTS)]
    ev.proxy_fences = {
        r["account_id"]: int(r["high_token"]) for r in await conn.fetch(_PROXY_FENCES)
    }
    ev.ledger_subjects = [f"{d.kind} {d.subject}" for d in await ledger_discrepancies(conn)]
    ev.escalated = {str(r["payout_id"]) for r in await conn.fetch(_ESCALATED)}
    return ev
