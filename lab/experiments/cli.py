"""`payouts-lab experiment pause|crash`: the UC-03 and UC-04 experiments on the real local stack."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lab.experiments.crash import CRASH_STATES, crash_experiment
from lab.experiments.harness import ExperimentError, default_config
from lab.experiments.pause import pause_experiment
from lab.stoppable import interrupted, run_stoppable
from stack.pki import trust_stack_ca_in_this_process


def _progress(line: str) -> None:
    print(f"  .. {line}", file=sys.stderr, flush=True)


def _report(result: dict[str, Any], as_json: bool) -> int:
    print(
        f"\n{result['experiment']} experiment ({result.get('fencing', result.get('at'))}, "
        f"backend {result['backend']}): {'PASS' if result['ok'] else 'FAIL'}"
    )
    for name, held in result["checks"].items():
        print(f"  [{'x' if held else ' '}] {name}")
    for key in (
        "t1",
        "t2",
        "final_state",
        "rail_movements",
        "rail_debited",
        "ledger_debited",
        "ledger_balanced",
        "fenced_out_events",
        "state_at_crash",
        "states",
    ):
        if key in result:
            print(f"  {key}: {result[key]}")
    if as_json:
        print(json.dumps(result, default=str, sort_keys=True))
    return 0 if result["ok"] else 1


def _evidence_dir(args: argparse.Namespace, name: str) -> Path:
    if args.evidence_dir:
        return Path(args.evidence_dir)
    return Path(".run") / "evidence" / name


def _cmd_pause(args: argparse.Namespace) -> int:
    fencing = args.fencing == "on"
    config = default_config(args.backend)
    evidence = _evidence_dir(args, f"pause-fencing-{args.fencing}-{args.backend}")
    try:
        trust_stack_ca_in_this_process()  # its stacks serve https only
        result = run_stoppable(
            pause_experiment(config, fencing=fencing, evidence_dir=evidence, progress=_progress)
        )
    except ExperimentError as exc:
        print(f"error: {exc} (logs under {config.run_dir})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted()
    print(f"evidence written to {evidence}")
    return _report(result, args.json)


def _cmd_crash(args: argparse.Namespace) -> int:
    config = default_config(args.backend)
    evidence = _evidence_dir(args, f"crash-{args.at.lower()}-{args.backend}")
    try:
        trust_stack_ca_in_this_process()  # its stacks serve https only
        result = run_stoppable(
            crash_experiment(config, at=args.at, evidence_dir=evidence, progress=_progress)
        )
    except ExperimentError as exc:
        print(f"error: {exc} (logs under {config.run_dir})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted()
    print(f"evidence written to {evidence}")
    return _report(result, args.json)


def register(sub: Any) -> None:
    exp = sub.add_parser("experiment", help="UC-03 pause and UC-04 crash experiments")
    esub = exp.add_subparsers(dest="experiment", required=True)
    pause = esub.add_parser(
        "pause", help="freeze a worker past its lease (SIGSTOP), then resume it"
    )
    pause.add_argument(
        "--fencing",
        choices=["on", "off"],
        default="on",
        help="off is the FR-29 negative control: the run must pay twice",
    )
    crash = esub.add_parser("crash", help="SIGKILL a worker at a state and watch recovery")
    crash.add_argument(
        "--at", choices=CRASH_STATES, required=True, help="the payout state to crash the worker in"
    )
    for p in (pause, crash):
        p.add_argument(
            "--backend", choices=["postgres", "etcd"], default="postgres", help="lock backend"
        )
        p.add_argument("--json", action="store_true", help="print the result as a last JSON line")
        p.add_argument("--evidence-dir", help="default .run/evidence/<experiment>")
    pause.set_defaults(func=_cmd_pause)
    crash.set_defaults(func=_cmd_crash)
