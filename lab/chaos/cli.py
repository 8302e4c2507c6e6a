"""`payouts-lab chaos`: the seeded fault-injection run (issue 7); see docs/chaos.md.

Progress lines (the schedule, each fault as it fires, terminal counts) go to stderr; the runner's
own JSON events go to RUN/chaos.log; the summary goes to stdout, as the LAST line with --json.
Exit status: fencing on, 0 when every invariant held and 1 otherwise; fencing off (the negative
control), 0 when violations WERE found and 1 when none were; 2 when the run could not complete.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from common.logs import configure_logging
from lab.chaos.faults import ChaosError
from lab.chaos.options import ChaosOptions
from lab.chaos.run import run_chaos
from lab.chaos.schedule import ScheduleError
from lab.stoppable import interrupted, run_stoppable
from stack.config import MAX_REPLICAS, StackError
from stack.pki import trust_stack_ca_in_this_process


def _progress(line: str) -> None:
    print(f"chaos: {line}", file=sys.stderr, flush=True)


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _replicas(raw: str) -> int:
    value = _positive(raw)
    if value > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"at most {MAX_REPLICAS}, got {value}")
    return value


def _print_human(s: dict[str, Any]) -> None:
    print(f"chaos run: seed {s['seed']}, backend {s['backend']}, fencing {s['fencing']}")
    print(
        f"  payouts {s['payouts']}: terminal {s['terminal']}, ambiguous open "
        f"{s['ambiguous_open']}, settled {s['settled']}"
    )
    print(f"  faults: {json.dumps(s['faults'])}")
    print(f"  violations: {json.dumps(s['violations'])}")
    print(
        f"  fenced_out {s['fenced_out']}, duplicate_movements {s['duplicate_movements']}, "
        f"reconcile {json.dumps(s['reconcile'])}"
    )
    a = s["availability"]
    print(
        f"  availability: acquire success ratio {a['acquire_success_ratio']} "
        f"({a['acquire_granted']} granted, {a['acquire_unavailable']} unavailable)"
        + (
            f", etcd leader-change windows {a['etcd_unavailable_s']} s"
            if s["backend"] == "etcd"
            else ""
        )
    )
    print(f"  elapsed {s['elapsed_s']}s, logs in {s['run_dir']}")
    print(s["verdict"])


def _cmd_chaos(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir or Path(".run") / f"chaos-{args.seed}-{uuid.uuid4().hex[:6]}")
    run_dir.mkdir(parents=True, exist_ok=True)
    opts = ChaosOptions(
        payouts=args.payouts,
        accounts=args.accounts,
        workers=args.workers,
        seed=args.seed,
        backend=args.backend,
        fencing=args.fencing == "on",
        run_dir=run_dir,
        postgres_standby=args.postgres_standby,
        replicas=args.replicas,
    )
    with open(run_dir / "chaos.log", "a") as events:
        configure_logging("chaos", stream=events)
        try:
            trust_stack_ca_in_this_process()  # its stacks serve https only
            summary = run_stoppable(run_chaos(opts, progress=_progress))
        except (ChaosError, ScheduleError, StackError) as exc:
            print(f"error: {exc} (logs under {run_dir})", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return interrupted(f" (logs under {run_dir})")
    _print_human(summary)
    if args.json:
        print(json.dumps(summary, sort_keys=True, default=str), flush=True)
    return int(summary["exit_code"])


def register(sub: Any) -> None:
    p = sub.add_parser(
        "chaos", help="seeded fault injection over the whole stack, then the invariant checker"
    )
    p.add_argument("--payouts", type=_positive, default=200, help="payouts in the workload")
    p.add_argument("--accounts", type=_positive, default=20, help="funded accounts")
    p.add_argument("--workers", type=_positive, default=2, help="workers (leases of 10 s)")
    p.add_argument("--seed", type=int, default=1, help="the fault schedule is a function of it")
    p.add_argument("--backend", choices=["postgres", "etcd"], default="postgres")
    p.add_argument(
        "--fencing",
        choices=["on", "off"],
        default="on",
        help="off is the negative control (FR-29): the run must show violations",
    )
    p.add_argument(
        "--postgres-standby",
        choices=["none", "sync"],
        default="sync",
        help="sync (default): PostgreSQL on a primary with a synchronous standby, and the run "
        "schedules a db_failover (SIGKILL of the primary, promotion of the standby); none: one "
        "PostgreSQL server",
    )
    p.add_argument(
        "--replicas",
        type=_replicas,
        default=2,
        help="lock servers, rail proxies and outbox publishers each, behind HAProxy (default 2, "
        "the production shape); 2 or more schedules the replica faults; 1: one of each",
    )
    p.add_argument("--json", action="store_true", help="print the summary as a last JSON line")
    p.add_argument("--run-dir", help="where the stack keeps its files (default .run/chaos-*)")
    p.set_defaults(func=_cmd_chaos)
