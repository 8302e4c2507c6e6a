"""`payouts-lab demo`: the main job (what `make demo` runs). See lab/demo/run.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import tracing
from common.logs import configure_logging
from lab.demo.report import render
from lab.demo.run import DemoOptions, run_demo
from lab.stoppable import interrupted, run_stoppable
from stack.pki import trust_stack_ca_in_this_process


def _progress(line: str) -> None:
    print(f"  .. {line}", file=sys.stderr, flush=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.payouts <= 0 or args.accounts <= 0 or args.workers <= 0:
        print("error: --payouts, --accounts and --workers must be positive", file=sys.stderr)
        return 2
    options = DemoOptions(
        payouts=args.payouts,
        accounts=args.accounts,
        workers=args.workers,
        backend=args.backend,
        run_dir=Path(args.run_dir),
        pause_experiment=not args.no_pause,
    )
    # The console gets the progress lines and the report; the JSON event stream goes to a file.
    options.run_dir.mkdir(parents=True, exist_ok=True)
    with open(options.run_dir / "demo.log", "a", encoding="utf-8") as events:
        configure_logging("demo", stream=events)
        # This process starts the payouts: the root of each trace, beside the stacks' spans.
        tracing.setup("demo", trace_dir=options.run_dir / "traces")
        try:
            trust_stack_ca_in_this_process()  # its stacks serve https only
            report = run_stoppable(run_demo(options, _progress))
        except KeyboardInterrupt:
            return interrupted()
    print(render(report))
    if args.json:
        print(json.dumps(report, default=str, sort_keys=True))
    return 0 if report["ok"] else 1


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="run the main job: stack, workload, experiment, report")
    demo.add_argument("--payouts", type=int, default=200, help="payouts in the workload")
    demo.add_argument("--accounts", type=int, default=50, help="accounts they spread over")
    demo.add_argument("--workers", type=int, default=3, help="worker processes")
    demo.add_argument(
        "--backend", choices=["postgres", "etcd"], default="postgres", help="lock backend"
    )
    demo.add_argument("--run-dir", default=".run/demo", help="logs and evidence go here")
    demo.add_argument("--no-pause", action="store_true", help="skip the pause experiment")
    demo.add_argument("--json", action="store_true", help="also print the report as JSON")
    demo.set_defaults(func=_cmd_demo)
