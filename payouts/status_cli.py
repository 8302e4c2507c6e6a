"""`payouts payout status|show` and `payouts audit`: what a payout is, why, and what was done
to it, as text for a person or `--json` for a machine.

`status` joins the workflow's `status` query (state, token, attempt, lookups, operator commands
and their verdicts, docs/workflow.md) with the payment database's row (state, amount, why it
FAILED) when a DSN is set; `show` is `status --audit`, with the payout's audit log; `payouts
audit` reads the audit log alone (one payout's, or the latest rows). Ids are taken as `payout
list` prints them too (`payout-<id>`). Must never: write anything, or print an operator
assertion's contents as text (the JSON keeps what the workflow returns, which holds no secret).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import asyncpg

from payouts.errors import EXIT_NOT_FOUND, CommandError, guard, payout_id_arg, workflow_error
from payouts.settings import connection_options, database_url, temporal_address
from payouts.workload import connect_temporal, find_payout

#: `paydb.payouts.failure_reason` (and the workflow's evidence) in words.
FAILURE_WORDS = {
    "insufficient_funds": "insufficient funds: the account's balance did not cover the amount "
    "(nothing was sent to the rail)",
    "declined_by_rail": "declined by the rail",
    "absent_at_rail": "absent at the rail: a lookup found that the rail never had it",
}

_DB_VARS = ("PAYDB_DATABASE_URL", "DATABASE_URL")
#: How long `status` waits for a worker to answer the workflow's query.
QUERY_TIMEOUT = timedelta(seconds=10)


def failure_words(reason: str | None) -> str:
    if not reason:
        return ""
    if reason.startswith("abandoned:"):
        return f"abandoned by an operator ({reason.removeprefix('abandoned:').strip()})"
    return FAILURE_WORDS.get(reason, reason)


def _optional_db(args: argparse.Namespace) -> str | None:
    """The payment database's DSN if one is set: `status` reads the row then, else says so."""
    if getattr(args, "database_url", None) or any(os.environ.get(v) for v in _DB_VARS):
        return database_url(args, "PAYDB_DATABASE_URL")
    return None


async def _db_part(db_url: str, payout_id: str, audit: bool) -> tuple[Any, list[Any]]:
    """The payout's row (None if absent) and its audit rows (all, or only the submission's)."""
    from ledger import PayoutStore
    from ledger.errors import UnknownPayout

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    try:
        store = PayoutStore(pool)
        try:
            row = await store.get_payout(payout_id)
        except UnknownPayout:
            row = None
        trail = await store.audit_trail(payout_id, limit=10_000) if row is not None else []
    finally:
        await pool.close()
    return row, trail if audit else [r for r in trail if r.to_state == "RAIL_SUBMITTED"]


async def gather_status(
    address: str, given: str, db_url: str | None, *, audit: bool
) -> dict[str, Any]:
    """The report `status` prints: the workflow's answer, the payment database's row, why it
    FAILED, and (with `audit`) its audit rows. Neither known: not found (exit 3)."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from workflows.payout import PayoutWorkflow

    client = await connect_temporal(address)
    unanswered: str | None = None
    try:
        payout_id = await find_payout(client, given)
    except CommandError as exc:
        if exc.code != EXIT_NOT_FOUND or db_url is None:
            raise
        payout_id, workflow = given, None  # a row nothing started yet (`payout start-pending`)
        if given.startswith("payout-") and (await _db_part(db_url, given, False))[0] is None:
            payout_id = given.removeprefix("payout-")  # the workflow id form, as `list` prints
    else:
        handle = client.get_workflow_handle_for(PayoutWorkflow.run, f"payout-{payout_id}")
        try:
            answer = await handle.query(PayoutWorkflow.status, rpc_timeout=QUERY_TIMEOUT)
            workflow, unanswered = asdict(answer), None
        except RPCError as exc:
            timed_out = exc.status == RPCStatusCode.DEADLINE_EXCEEDED or "Timeout" in str(exc)
            # A query that outlives its deadline on a loaded machine can also end as a reset
            # stream ("h2 protocol error") rather than DEADLINE_EXCEEDED: the workflow's own
            # description then says whether it is there and who should have answered.
            reset = "h2 protocol error" in str(exc)
            if not (timed_out or reset):
                raise workflow_error(exc, payout_id, address) from None
            try:
                workflow, unanswered = None, await _unanswered(handle)
            except RPCError:
                raise workflow_error(exc, payout_id, address) from None
        except WorkflowQueryFailedError as exc:
            raise workflow_error(exc, payout_id, address) from None
    row, trail = await _db_part(db_url, payout_id, audit) if db_url else (None, [])
    if workflow is None and row is None and not unanswered:
        raise CommandError(f"unknown payout {given} (no workflow, no row)", EXIT_NOT_FOUND)
    report: dict[str, Any] = {
        "payout_id": payout_id,
        "workflow_id": f"payout-{payout_id}",
        "workflow": workflow,
        "database": _row_json(row) if row else None,
    }
    if unanswered:
        report["workflow_note"] = unanswered
    if db_url is None:
        report["database_note"] = "not read: set $PAYDB_DATABASE_URL or $DATABASE_URL"
    _fill_recorded_at(workflow, trail)
    report["failure"] = payout_failure(workflow, row)
    if audit:
        report["audit"] = [_audit_json(r) for r in trail]
    return report


async def _unanswered(handle: Any) -> str:
    """Why the workflow gave no answer: its status, and the queue no worker answered on."""
    desc = await handle.describe()
    return (
        f"its workflow is {desc.status.name if desc.status else 'unknown'} but no worker "
        f"answered the status query within {QUERY_TIMEOUT.seconds} s (is a worker polling task "
        f"queue {desc.task_queue}?)"
    )


def _row_json(row: Any) -> dict[str, Any]:
    out = {k: v for k, v in asdict(row).items()}
    out["state"] = str(row.state)
    for k in ("created_at", "updated_at"):
        out[k] = out[k].isoformat()
    out["ledger_group_id"] = str(row.ledger_group_id) if row.ledger_group_id else None
    return out


def _audit_json(r: Any) -> dict[str, Any]:
    out = asdict(r)
    out["at"] = r.at.isoformat()
    out["details"] = json.loads(r.details)
    return out


def _fill_recorded_at(workflow: dict[str, Any] | None, trail: list[Any]) -> None:
    """The attempt's `recorded_at`, when the workflow's view has none (the two-task step's
    does not carry it): when the payment database recorded the submission."""
    attempt = (workflow or {}).get("attempt")
    submitted = [r for r in trail if r.to_state == "RAIL_SUBMITTED"]
    if attempt and not attempt.get("recorded_at") and submitted:
        attempt["recorded_at"] = submitted[-1].at.isoformat()
        attempt["recorded_at_source"] = "payment database: the RAIL_SUBMITTED audit row"


def payout_failure(workflow: dict[str, Any] | None, row: Any) -> str | None:
    """Why the payout FAILED or was ABANDONED, in words; None for any other state."""
    state = str(row.state) if row else (workflow or {}).get("state")
    if state not in ("FAILED", "ABANDONED"):
        return None
    if row is not None and row.failure_reason:
        return failure_words(row.failure_reason)
    attempt = (workflow or {}).get("attempt") or {}
    lookup = (workflow or {}).get("last_lookup") or {}
    if attempt.get("outcome") == "DECLINED":
        return failure_words("declined_by_rail")
    if lookup.get("status") == "absent" or (workflow or {}).get("resolution") == "absent":
        return failure_words("absent_at_rail")
    return (workflow or {}).get("last_error") or "not recorded"


def render(report: dict[str, Any]) -> str:
    """The report as lines a person reads top-down: the answer first, then the detail."""
    wf, row = report["workflow"], report["database"]
    state = row["state"] if row else (wf or {}).get("state", "unknown (no answer)")
    lines = [f"payout {report['payout_id']}  (workflow {report['workflow_id']})"]
    head = f"state        {state}"
    if report["failure"]:
        head += f": {report['failure']}"
    if wf and row and wf["state"] != row["state"]:
        head += f"  (the workflow last saw {wf['state']})"
    lines.append(head)
    if row:
        lines.append(f"account      {row['account_id']}  amount {row['amount']} (minor units)")
    elif wf:
        lines.append(f"account      {wf['account_id'] or '?'}")
    if wf:
        lines += _workflow_lines(wf)
    elif report.get("workflow_note"):
        lines.append(f"workflow     {report['workflow_note']}")
    else:
        lines.append("workflow     none (`payouts payout start-pending` starts one)")
    if row:
        lines.append(
            f"database     state {row['state']}, fence {row['fence']}, reason "
            f"{row['failure_reason'] or '-'}, created {row['created_at']}, "
            f"updated {row['updated_at']}"
        )
    else:
        lines.append(f"database     {report.get('database_note') or 'no row for this payout'}")
    if "audit" in report:
        lines.append(f"audit        {len(report['audit'])} row(s)")
        lines += [f"  {audit_line(a)}" for a in report["audit"]]
    return "\n".join(lines)


def _workflow_lines(wf: dict[str, Any]) -> list[str]:
    lines = [f"token        {wf['token']}    runs {wf['runs']}"]
    a = wf["attempt"]
    if a:
        lines.append(
            f"attempt      {a['attempt_id']}: {a['outcome'] or 'in flight'}, token {a['token']}, "
            f"recorded at {a['recorded_at'] or 'unknown'}"
        )
    lines.append(f"escalated    {'yes' if wf['escalated'] else 'no'}")
    if wf["resolution"] or wf["evidence"]:
        lines.append(
            f"rail         resolution {wf['resolution'] or '-'} (known, not yet written), "
            f"evidence {wf['evidence'] or '-'}"
        )
    last = wf["last_lookup"]
    lookups = f"lookups      {wf['lookups']}"
    if last:
        lookups += f"; last #{last['number']} {last['status']} at {last['at']}"
        lookups += f": {last['detail']}" if last["detail"] else ""
    lines.append(lookups)
    commands = wf["commands"]
    lines.append(f"commands     {len(commands) or 'none'}")
    for c in commands:
        who = c["actor"] or c["operator"] or "?"
        lines.append(
            f"  {c['action']} via {c['via']} by {who} ({c['reason']!r}): {c['status']}"
            + (f": {c['why']}" if c["why"] else "")
            + (f" [{c['at']}]" if c["at"] else "")
        )
    revokes = [c for c in commands if c["action"] == "revoke"]
    done = sum(1 for c in revokes if c["status"] == "carried_out")
    lines.append(f"revokes      {done} carried out, {wf['pending_revokes']} waiting")
    for r in wf["rejected_signals"]:
        lines.append(f"rejected     {r['signal']} from {r['operator']!r}: {r['why']}")
    if wf["cancel_requests"]:
        lines.append(f"cancel       {wf['cancel_requests']} request(s), refused")
    if wf["last_error"]:
        lines.append(f"last error   {wf['last_error']}")
    return lines


def audit_line(a: dict[str, Any]) -> str:
    move = f" {a['from_state'] or '-'} -> {a['to_state']}" if a["to_state"] else ""
    token = f" token {a['token']}" if a["token"] is not None else ""
    details = f" {json.dumps(a['details'], sort_keys=True)}" if a["details"] else ""
    return f"#{a['audit_id']} {a['at']} {a['actor']} {a['action']}{move}{token}{details}"


def _cmd_status(args: argparse.Namespace) -> int:
    audit = bool(args.audit) or args.payout_command == "show"
    db_url = _optional_db(args)
    if audit and db_url is None:
        database_url(args, "PAYDB_DATABASE_URL")  # the audit log needs it: a clear error
    report = asyncio.run(gather_status(temporal_address(args), args.payout_id, db_url, audit=audit))
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


async def _audit_rows(db_url: str, payout_id: str | None, limit: int) -> list[dict[str, Any]]:
    from ledger import PayoutStore

    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    try:
        rows = await PayoutStore(pool).audit_trail(payout_id, limit=limit)
    finally:
        await pool.close()
    return [_audit_json(r) for r in rows]


def _cmd_audit(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise CommandError("--limit must be positive")
    payout_id = args.payout.removeprefix("payout-") if args.payout else None
    db_url = database_url(args, "PAYDB_DATABASE_URL")
    rows = asyncio.run(_audit_rows(db_url, payout_id, args.limit))
    if not rows and args.payout and payout_id != args.payout:
        rows = asyncio.run(_audit_rows(db_url, args.payout, args.limit))  # an id `payout-...`
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for a in rows:
        print(audit_line(a))
    print(f"{len(rows)} audit row(s)")
    return 0


def register(psub: Any, sub: Any) -> None:
    """`payouts payout status|show` under `payouts payout`, and `payouts audit`."""
    for name, help_ in (
        ("status", "a payout: state and why, attempt, lookups, operator commands and verdicts"),
        ("show", "`status --audit`: the payout with its audit log"),
    ):
        p = psub.add_parser(name, help=help_)
        p.add_argument("payout_id", type=payout_id_arg, help="PAYOUT_ID or payout-PAYOUT_ID")
        p.add_argument("--json", action="store_true", help="one JSON object instead of text")
        if name == "status":
            p.add_argument("--audit", action="store_true", help="with its audit log rows")
        connection_options(p, db=True, temporal=True)
        p.set_defaults(func=guard(_cmd_status), audit=name == "show")
    audit = sub.add_parser("audit", help="the payment database's audit log, without psql")
    audit.add_argument("--payout", type=payout_id_arg, help="only this payout's rows")
    audit.add_argument("--limit", type=int, default=200, help="the latest N rows")
    audit.add_argument("--json", action="store_true", help="one JSON list instead of lines")
    connection_options(audit, db=True)
    audit.set_defaults(func=guard(_cmd_audit))
