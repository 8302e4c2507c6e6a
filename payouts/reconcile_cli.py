"""`payouts reconcile run` and `payouts reconcile schedule` (UC-07, FR-26).

`run` reconciles one closed window now and prints the report; exit status 0 when clean, 1 when
discrepancies were found, 2 on error (like diff(1)). `schedule` creates or updates the Temporal
Schedule `reconcile-hourly`, which starts ReconcileWorkflow every interval. Neither ever writes
to the payment database or the proxy's tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from temporalio.client import Client

from common.credentials import CredentialsError
from common.logs import configure_logging, get_logger
from common.temporal_tls import TemporalTLSError, temporal_tls
from payouts.settings import database_url
from reconcile.reconciler import (
    ReconcileError,
    ReconcileReport,
    ReconcileSettings,
    Window,
    reconcile,
    stub_movement_source,
)
from workflows.reconcile_schedule import SCHEDULE_ID, ensure_schedule

log = get_logger("payouts.reconcile_cli")

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def _out(line: str) -> None:
    """Command output goes to stdout (events go to stderr), so `--json` output stays parseable."""
    sys.stdout.write(line + "\n")


def parse_duration(text: str) -> timedelta:
    """'1h', '30m', '90s', '1h30m' -> timedelta (a positive whole number of seconds)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"not a duration like 1h, 30m or 90s: {text!r}")
    h, m, s = (int(g) if g else 0 for g in match.groups())
    delta = timedelta(hours=h, minutes=m, seconds=s)
    if delta <= timedelta(0):
        raise argparse.ArgumentTypeError("the duration must be positive")
    return delta


def parse_instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give a time zone, e.g. {text}Z or {text}+00:00")
    return value


def last_closed_window(settings: ReconcileSettings, now: datetime) -> Window:
    end = now - timedelta(seconds=settings.settle_lag_s)
    return Window(start=end - timedelta(seconds=settings.window_s), end=end)


def report_dict(report: ReconcileReport) -> dict[str, Any]:
    body = asdict(report)
    body["window"] = {
        "start": report.window.start.isoformat(),
        "end": report.window.end.isoformat(),
    }
    return body


async def _run(
    args: argparse.Namespace, settings: ReconcileSettings, token: str | None
) -> ReconcileReport:
    window = last_closed_window(settings, datetime.now(UTC))
    window = Window(start=args.window_start or window.start, end=args.window_end or window.end)
    conn = await asyncpg.connect(database_url(args, "RECONCILE_DATABASE_URL"))
    try:
        return await reconcile(
            conn,
            stub_movement_source(
                args.rail_admin_url or settings.rail_admin_url,
                token=token,
                verify=settings.client_verify(),  # against RECONCILE_TLS_CA_FILE when set
            ),
            window,
            ambiguity_sla=timedelta(seconds=settings.ambiguity_sla_s),
            sample_size=settings.sample_size,
        )
    finally:
        await conn.close()


def _cmd_run(args: argparse.Namespace) -> int:
    settings = ReconcileSettings()
    try:  # before connecting: a token file that cannot be read is one line, nothing started
        token = settings.token()
    except CredentialsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    configure_logging("reconcile")
    try:
        report = asyncio.run(_run(args, settings, token))
    except ReconcileError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.json:
        _out(json.dumps(report_dict(report), sort_keys=True))
    else:
        _out(f"window {report.window.start.isoformat()} .. {report.window.end.isoformat()}")
        _out(f"checked payouts: {report.checked_payouts}")
        for cls, count in report.counts.items():
            sample = ", ".join(report.samples[cls])
            _out(f"  {cls:<28} {count:>6}" + (f"  e.g. {sample}" if sample else ""))
        _out("OK: no discrepancies" if report.ok else "DISCREPANCIES FOUND (nothing was repaired)")
    return 0 if report.ok else 1


def _cmd_schedule(args: argparse.Namespace) -> int:
    configure_logging("reconcile")
    settings = ReconcileSettings()
    try:  # before connecting: one line, nothing started
        tls = temporal_tls()
    except TemporalTLSError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2

    async def go() -> str:
        address = os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233")
        namespace = os.environ.get("TEMPORAL_NAMESPACE", "default")
        client = await Client.connect(address, namespace=namespace, tls=tls)
        handle = await ensure_schedule(
            client,
            every=args.every,
            task_queue=args.task_queue or settings.task_queue,
            settle_lag_s=settings.settle_lag_s,
        )
        return handle.id

    schedule_id = asyncio.run(go())
    _out(f"schedule {schedule_id}: ReconcileWorkflow every {args.every}")
    return 0


def register(subparsers: Any) -> None:
    """Add `payouts reconcile run|schedule`."""
    rec = subparsers.add_parser("reconcile", help="read-only reconciliation (UC-07, FR-26)")
    sub = rec.add_subparsers(dest="reconcile_command", required=True)

    run = sub.add_parser("run", help="reconcile one closed window now and print the report")
    run.add_argument("--window-start", type=parse_instant, help="ISO time with zone")
    run.add_argument("--window-end", type=parse_instant, help="ISO time with zone")
    run.add_argument("--json", action="store_true", help="print the report as one JSON object")
    run.add_argument(
        "--database-url", help="defaults to $RECONCILE_DATABASE_URL, else $DATABASE_URL"
    )
    run.add_argument("--rail-admin-url", help="defaults to $RECONCILE_RAIL_ADMIN_URL")
    run.set_defaults(func=_cmd_run)

    sch = sub.add_parser("schedule", help=f"create/update the Temporal Schedule {SCHEDULE_ID}")
    sch.add_argument(
        "--every", type=parse_duration, default=timedelta(hours=1), help="how often it runs"
    )
    sch.add_argument("--task-queue", help="defaults to $RECONCILE_TASK_QUEUE or 'payouts'")
    sch.set_defaults(func=_cmd_schedule)
