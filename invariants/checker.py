"""The invariant checker (INV-01..INV-10, NFR-06, NFR-07).

Computes the ten correctness invariants from five sources of evidence: the payment database
(`paydb`: payouts, balances, audit log, ledger), the rail proxy's records (`railproxy`: attempts,
per-account high-water tokens), the rail's movement log, the lock service's grant history, and
Temporal's record of payout workflows that closed without completing (INV-10; optional).
Each invariant is reported with a count of violations and a bounded sample.

Owns: the evidence queries, the report, the `invariants.checked` and `invariants.violation`
events and the `invariants_*` metrics. The grant-history and workflow sources are in
`invariants.sources`, the errors in `invariants.errors`, the rules in `invariants.rules` (pure).

Must never: write anything, anywhere (in Temporal it only lists and describes workflows). The
database evidence is read in ONE read-only REPEATABLE READ transaction (one snapshot; PostgreSQL
itself refuses a write in it), and the PostgreSQL grant source reads in a read-only transaction of
its own. It never repairs, resubmits, revokes, or terminates a workflow.

Evidence order matters:
1. the movement log first (as the reconciler does): the proxy commits an attempt before it
   forwards (FR-19), so every movement we see has its attempt in the later snapshot;
   then the closed payout workflows: a closed run is final, so a payout the later snapshot
   still shows non-terminal was truly left behind by it (INV-10);
   then the payout locks held now (INV-10's blocked accounts): the snapshot is later, so every
   write or attempt made under a holding before it was observed is in it (a holding is never
   judged unused for want of a write the snapshot missed);
2. then the database snapshot;
3. then the grant history: a write in the snapshot was made under a grant acquired before it, so a
   history read AFTER the snapshot contains every grant any write in it presented (no false
   INV-07). Grants acquired after the snapshot only add later intervals, which no rule misreads.

Clocks: write times (audit `at`, attempt `recorded_at`) are PostgreSQL's; grant times come from
the lock backend (PostgreSQL's clock too when it is the same server; the etcd backend stamps with
its lock server's clock). INV-01 and INV-07 compare the two, so run them on one clock in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg
from prometheus_client import Counter, Gauge
from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.credentials import operator_token, read_token
from common.logs import get_logger
from invariants.blocked import held_keys
from invariants.errors import (
    GrantSourceUnavailable,
    HoldSourceUnavailable,
    InvariantError,
    MovementsUnavailable,
    WorkflowSourceUnavailable,
)
from invariants.evidence import (
    HOLD_BOUND_S,
    AttemptRow,
    Evidence,
    GrantFact,
    PayoutRow,
    Transition,
    WorkflowFact,
    Write,
)
from invariants.holds import HoldSource, lock_server_hold_source, postgres_hold_source
from invariants.rules import INVARIANTS, check
from invariants.sources import (
    GrantSource,
    WorkflowSource,
    lock_server_grant_source,
    merged_grant_source,
    postgres_grant_source,
    temporal_workflow_source,
)
from ledger.queries import ledger_discrepancies
from railstub.client import MovementLogUnavailable, MovementSource, stub_movement_source

__all__ = [
    "INVARIANTS",
    "GrantFact",
    "GrantSource",
    "GrantSourceUnavailable",
    "HoldSource",
    "HoldSourceUnavailable",
    "InvariantError",
    "InvariantReport",
    "InvariantResult",
    "InvariantSettings",
    "MovementsUnavailable",
    "WorkflowFact",
    "WorkflowSource",
    "WorkflowSourceUnavailable",
    "check_invariants",
    "history_kinds",
    "lock_server_grant_source",
    "lock_server_hold_source",
    "merged_grant_source",
    "postgres_grant_source",
    "postgres_hold_source",
    "stub_movement_source",
    "temporal_workflow_source",
]

log = get_logger("invariants.checker")

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

    #: Where the grant history is read: `postgres` (the lockservice table), `http` (the lock
    #: server, whichever backend it runs on), or both, comma-separated and merged: a deployment
    #: whose lock server has run on both backends (merged_grant_source says why).
    history: str = "postgres"
    lock_database_url: str | None = None  # lockservice schema's database; default DATABASE_URL
    lock_prefix: str = ""  # the lock backend's namespace prefix (PostgreSQL source)
    sample_size: int = 10
    #: INV-10: a payout lock held by a live session and unused this long blocks its account
    #: (invariants.blocked: longer than the workers' idle-lease sweeper takes to give one back).
    hold_bound_s: float = HOLD_BOUND_S

    @field_validator("history")
    @classmethod
    def _history_kinds(cls, value: str) -> str:
        history_kinds(value)
        return value


HISTORY_KINDS = ("postgres", "http")


def history_kinds(value: str) -> list[str]:
    """`postgres`, `http` or `postgres,http` as a list; anything else is a ValueError."""
    kinds = [k.strip() for k in value.split(",") if k.strip()]
    if not kinds or any(k not in HISTORY_KINDS for k in kinds) or len(set(kinds)) < len(kinds):
        raise ValueError(f"history must be postgres, http or postgres,http, not {value!r}")
    return kinds


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


# ---------------------------------------------------------------------- the check


async def check_invariants(
    conn: asyncpg.Connection,
    movement_source: MovementSource,
    grant_source: GrantSource,
    *,
    workflow_source: WorkflowSource | None = None,
    settled: bool = False,
    sample_size: int = 10,
    hold_source: HoldSource | None = None,
    hold_bound_s: float = HOLD_BOUND_S,
) -> InvariantReport:
    """Check INV-01..INV-10 once; emit `invariants.checked` and one `invariants.violation` per
    violated invariant. Raises an InvariantError when a source is unreadable.

    `workflow_source` None: INV-10's workflow rule is not evaluated (reported in
    `not_checked`). `settled`: the caller knows the system has settled (every payout had its
    chance to finish), so INV-10's "terminal or escalated" rule applies; mid-run it must not.
    `hold_source` None: INV-10's blocked-account rule is not evaluated (`not_checked`); else a
    payout lock held unused for longer than `hold_bound_s` is a violation at any time."""
    try:
        movements = await movement_source()  # first: see the module docstring
        workflows = None if workflow_source is None else list(await workflow_source())
        holds = None if hold_source is None else list(await hold_source(await _accounts(conn)))
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            ev = await _gather(conn)
        ev.holds, ev.holds_checked = holds or [], holds is not None
        ev.hold_bound_s = hold_bound_s
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
            "held_payout_locks": len(held_keys(ev.holds)),
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
    if not ev.holds_checked:
        out.append("INV-10 blocked accounts (no source of the locks held was given)")
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


async def _accounts(conn: asyncpg.Connection) -> list[str]:
    """The accounts whose payout locks the holdings source is asked about."""
    try:
        rows = await conn.fetch("SELECT DISTINCT account_id FROM paydb.payouts")
    except asyncpg.PostgresError as exc:
        raise HoldSourceUnavailable(f"accounts unreadable: {exc}") from exc
    return [str(r["account_id"]) for r in rows]


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
