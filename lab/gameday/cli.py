"""`payouts-lab gameday`: the game day (issue 17, NFR-11). See lab/gameday/run.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common.logs import configure_logging
from lab.gameday.prom import PrometheusMissingError, binary
from lab.gameday.run import (
    GAMEDAY_DOC,
    GamedayOptions,
    append_table,
    run_gameday,
    selected,
    table,
)
from lab.stoppable import interrupted, run_stoppable
from stack.pki import trust_stack_ca_in_this_process


def _progress(line: str) -> None:
    print(f"  .. {line}", file=sys.stderr, flush=True)


def _cmd_gameday(args: argparse.Namespace) -> int:
    if args.for_s <= 0 or args.interval_s <= 0:
        print("error: --for-s and --interval-s must be positive", file=sys.stderr)
        return 2
    try:
        binary("prometheus")
    except PrometheusMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = GamedayOptions(
        run_dir=Path(args.run_dir),
        short=not args.all,
        only=args.only,
        for_s=args.for_s,
        interval_s=args.interval_s,
        doc=Path(args.doc),
    )
    if args.only is not None and not selected(options.short, args.only):
        print(f"error: no scenario matches --only {args.only!r}", file=sys.stderr)
        return 2
    options.run_dir.mkdir(parents=True, exist_ok=True)
    with open(options.run_dir / "gameday.log", "a", encoding="utf-8") as events:
        configure_logging("gameday", stream=events)
        try:
            trust_stack_ca_in_this_process()  # its stacks serve https only
            rows = run_stoppable(run_gameday(options, _progress))
        except KeyboardInterrupt:
            return interrupted()
    text = table(rows, short=options.short, only=options.only)
    print(text)
    if not args.no_doc:
        append_table(options.doc, text)
    return 0 if rows and all(r.ok for r in rows) else 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gameday",
        help="cause every alert's condition for real, see it fire in Prometheus, recover",
        description="Starts the local stack and a real Prometheus loading the shipped "
        "ops/prometheus/prometheus.yml with this stack's addresses and rules.yml (shortened "
        "windows, for: and thresholds), runs one scenario per alert, runs each alert's runbook "
        "section (docs/runbooks/) as written, and appends detection latency and recovery time "
        "to docs/gameday.md. Exit 0 only if every alert fired, its runbook's commands held, it "
        "resolved after recovery, and no alert fired without its condition. Needs prometheus "
        "on PATH.",
    )
    p.add_argument("--all", action="store_true", help="every scenario (default: the short set)")
    p.add_argument(
        "--only",
        metavar="WORD",
        help="only the scenarios whose name or alert contains WORD (any case; several: "
        "comma-separated), e.g. FencedOutWrite,ReconciliationDiscrepancies; with --all, from "
        "the full set",
    )
    p.add_argument("--run-dir", default=".run/gameday", help="logs, Prometheus data, stack")
    p.add_argument("--doc", default=str(GAMEDAY_DOC), help="the table is appended here")
    p.add_argument("--no-doc", action="store_true", help="print the table only")
    p.add_argument("--for-s", type=float, default=3.0, help="every alert's for: (game day)")
    p.add_argument("--interval-s", type=float, default=1.0, help="scrape/evaluation interval")
    p.set_defaults(func=_cmd_gameday)
