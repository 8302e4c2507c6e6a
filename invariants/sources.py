"""The checker's injected sources of evidence outside the payment database: the lock service's
grant history (PostgreSQL table, the lock server over HTTP, or both merged) and Temporal's payout
workflows that closed without completing (INV-10). The rail's movement log source is the rail stub's
client, `railstub.client.stub_movement_source`.

Must never: write, or act on a workflow (it only lists and describes them). Each source returns
all of its evidence or raises its `InvariantError`: a partial history could hide a repeated
token or an overlap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import asyncpg
import httpx

from common.credentials import auth_headers
from invariants.errors import GrantSourceUnavailable, WorkflowSourceUnavailable
from invariants.evidence import GrantFact, GrantHistory, WorkflowFact
from invariants.rules import WORKFLOW_ID_PREFIX

__all__ = [
    "STOPPED_STATUSES",
    "GrantSource",
    "WorkflowSource",
    "lock_server_grant_source",
    "merged_grant_source",
    "postgres_grant_source",
    "temporal_workflow_source",
]

#: The lock service's grant history, injected (PostgreSQL table, or the lock server over HTTP).
GrantSource = Callable[[], Awaitable[Sequence[GrantFact]]]
#: Payout workflows whose latest run closed without completing (Temporal, or a test's list).
WorkflowSource = Callable[[], Awaitable[Sequence[WorkflowFact]]]


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


def merged_grant_source(sources: Sequence[GrantSource]) -> GrantSource:
    """The grants of several histories as one: every backend that ever issued grants.

    Why: the lock server answers `GET /v1/history` from the backend it runs on now, and the
    PostgreSQL table holds only what the PostgreSQL backend issued. After a deployment switches
    the lock server from PostgreSQL to etcd (docs/deploy-compose.md), the writes made under the
    earlier grants are only in the table and the later ones only behind the server: either
    source alone reports every write of the other backend as INV-07 "without grant" (1,605 false
    violations in the compose run of issue 25). Merged, each write is judged against every
    grant any backend issued; a token no backend granted is still a violation.

    A grant read from two sources (the server running on PostgreSQL answers from the table) is
    kept once, as the first source gives it: same key, token and acquisition time. The horizon is
    the latest of the sources' horizons (a pruned etcd history): before it, one of the backends'
    grants may be missing, so INV-07 judges nothing earlier. Every source must answer whole, or
    the merge raises its GrantSourceUnavailable (a partial history could hide a violation)."""
    if not sources:
        raise ValueError("merged_grant_source needs at least one source")

    async def fetch() -> Sequence[GrantFact]:
        seen: set[tuple[str, int, datetime]] = set()
        merged = GrantHistory()
        horizons: list[datetime] = []
        for source in sources:
            grants = await source()
            since = getattr(grants, "complete_since", None)
            if since is not None:
                horizons.append(since)
            for g in grants:
                identity = (g.key, g.token, g.acquired_at)
                if identity not in seen:
                    seen.add(identity)
                    # seq (the order among grants acquired at the same instant) becomes the
                    # position in the merge, which keeps each source's own order.
                    merged.append(replace(g, seq=len(merged)))
        merged.complete_since = max(horizons) if horizons else None
        return merged

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

        from common.temporal_tls import TemporalTLSError, temporal_tls

        stopped = {
            WorkflowExecutionStatus.FAILED,
            WorkflowExecutionStatus.TERMINATED,
            WorkflowExecutionStatus.TIMED_OUT,
            WorkflowExecutionStatus.CANCELED,
        }
        try:
            client = await Client.connect(address, namespace=namespace, tls=temporal_tls())
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
        except (RPCError, RuntimeError, OSError, TemporalTLSError) as exc:
            raise WorkflowSourceUnavailable(f"Temporal unavailable at {address}: {exc}") from exc

    return fetch
