"""The evidence an experiment (and the lab's other runs) gathers: the services' structured events,
the database's rows of a payout, the rail's movements, the ledger's balance, the workflow's
history; and the folder each run writes it to (events, database extracts, the rail's movement
log).

Owns: reading what happened and writing it down. Must never: write to the system under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from stack.system import Stack

__all__ = [
    "db_extract",
    "json_events",
    "ledger_balanced",
    "rail_movements",
    "resumed_then_submitted",
    "workflow_timeline",
    "write_evidence",
]


def resumed_then_submitted(events: list[dict[str, Any]]) -> bool:
    """Whether a worker frozen by the UC-03 hook made its rail submission after it resumed."""
    resumed = [i for i, e in enumerate(events) if e.get("event") == "experiment.resumed"]
    return bool(resumed) and any(e.get("event") == "rail.submit" for e in events[resumed[0] :])


def json_events(path: Path) -> list[dict[str, Any]]:
    """The structured JSON events in a service log (other lines are skipped)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


async def db_extract(database_url: str, payout_id: str, account_id: str) -> dict[str, Any]:
    """The payout's rows: itself, its audit log, ledger entries, balance and proxy attempts."""
    conn = await asyncpg.connect(database_url)
    try:

        def rows(records: list[asyncpg.Record]) -> list[dict[str, Any]]:
            return [
                {k: (str(v) if not isinstance(v, int | str | None) else v) for k, v in r.items()}
                for r in records
            ]

        return {
            "payout": rows(
                await conn.fetch(
                    "SELECT payout_id, account_id, amount, state, fence, failure_reason"
                    " FROM paydb.payouts WHERE payout_id = $1",
                    payout_id,
                )
            ),
            "audit": rows(
                await conn.fetch(
                    "SELECT at, actor, token, action, from_state, to_state FROM paydb.audit_log"
                    " WHERE payout_id = $1 ORDER BY at, audit_id",
                    payout_id,
                )
            ),
            "ledger_entries": rows(
                await conn.fetch(
                    "SELECT e.group_id, e.account_id, e.amount FROM paydb.ledger_entries e"
                    " JOIN paydb.ledger_groups g ON g.group_id = e.group_id"
                    " WHERE g.payout_id = $1 ORDER BY e.account_id",
                    payout_id,
                )
            ),
            "balance": rows(
                await conn.fetch(
                    "SELECT account_id, balance, fence FROM paydb.balances WHERE account_id = $1",
                    account_id,
                )
            ),
            "proxy_attempts": rows(
                await conn.fetch(
                    "SELECT attempt_id, token, outcome, recorded_at, fencing_enforced,"
                    " guard_bypassed"
                    " FROM railproxy.attempts WHERE payout_id = $1 ORDER BY attempt_id",
                    payout_id,
                )
            ),
        }
    finally:
        await conn.close()


async def rail_movements(stack: Stack, client_reference: str) -> list[dict[str, Any]]:
    """The rail stub's movements of one client reference (its operator-only admin endpoint)."""
    async with httpx.AsyncClient(
        base_url=stack.railstub_url, timeout=5, headers=stack.operator_headers()
    ) as http:
        r = await http.get("/admin/movements", params={"client_reference": client_reference})
        r.raise_for_status()
        return [m for m in r.json()["movements"] if m["client_reference"] == client_reference]


async def ledger_balanced(database_url: str) -> bool:
    """Whether the ledger has no discrepancy (ledger.queries.ledger_discrepancies)."""
    from ledger.queries import ledger_discrepancies

    conn = await asyncpg.connect(database_url)
    try:
        return not await ledger_discrepancies(conn)
    finally:
        await conn.close()


async def workflow_timeline(address: str, workflow_id: str) -> list[dict[str, Any]]:
    """A workflow's history as [{s, event, activity, task_queue}], `s` seconds after its first
    event: e.g. how long a frozen worker's long-polls held its workflow tasks."""
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    out: list[dict[str, Any]] = []
    first = None
    for e in history.events:
        at = e.event_time.ToDatetime()
        first = first or at
        kind = e.WhichOneof("attributes") or ""
        attrs = getattr(e, kind, None)
        row: dict[str, Any] = {
            "s": round((at - first).total_seconds(), 3),
            "event": kind.removesuffix("_event_attributes"),
        }
        for f in ("activity_type", "task_queue"):
            if attrs is not None and attrs.DESCRIPTOR.fields_by_name.get(f) is not None:
                row[f] = getattr(attrs, f).name or None
        if kind.endswith("timed_out_event_attributes") or kind.endswith(
            "completed_event_attributes"
        ):
            row["scheduled_event_id"] = getattr(attrs, "scheduled_event_id", None)
        row["id"] = e.event_id
        out.append(row)
    return out


def write_evidence(folder: Path, name: str, data: Any) -> None:
    """Write `data` as sorted, indented JSON to `folder/name`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data, indent=2, default=str, sort_keys=True) + "\n")
