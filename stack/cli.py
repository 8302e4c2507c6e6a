"""`payouts up`: start the whole system on this machine (a thin layer over stack.system.Stack).

Owns: argument parsing, human-readable progress and addresses, and turning Ctrl-C/SIGTERM into
an orderly stop. Must never: exit while a child it started is still running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from common.logs import configure_logging
from stack.config import DEFAULT_RUN_DIR, StackConfig, StackError
from stack.system import Stack


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _summary(stack: Stack) -> str:
    rows = [
        ("Temporal", stack.temporal_address),
        ("Temporal Web UI", stack.ui_url),
        ("PostgreSQL", stack.database_url),
        ("lock server", f"{stack.lock_url} (backend {stack.config.backend})"),
        ("rail stub", stack.railstub_url),
        ("rail proxy", stack.railproxy_url),
    ]
    if stack.etcd_endpoints:
        rows.append(("etcd", ",".join(stack.etcd_endpoints)))
    if stack.finledger_url:
        rows.append(("finance ledger", stack.finledger_url))
    for name, info in sorted(stack.processes.items()):
        rows.append((f"pid {name}", f"{info.pid}  log {info.log_path}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def exports(stack: Stack) -> str:
    """Ready-to-paste `export` lines: every address a command needs, for this stack's ports."""
    env = export_env(stack)
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def export_env(stack: Stack) -> dict[str, str]:
    """The variables `exports` prints (the game day runs operator commands with them)."""
    return {
        "DATABASE_URL": stack.database_url,  # the admin DSN: `payouts db migrate`, bump-epoch
        **stack.role_urls,  # each command's own role (docs/database-roles.md)
        "PGPASSFILE": str(stack.pgpass_file),  # their passwords, never printed
        "TEMPORAL_ADDRESS": stack.temporal_address,
        "LOCK_URL": stack.lock_url,
        "WORKER_TASK_QUEUE": stack.config.task_queue,
        # Where `payouts payout create` writes its spans and `payouts payout trace` reads them.
        "PAYOUTS_TRACE_DIR": str((stack.config.run_dir / "traces").resolve()),
        "RECONCILE_RAIL_ADMIN_URL": stack.railstub_url,
        "INVARIANTS_RAIL_ADMIN_URL": stack.railstub_url,
        "INVARIANTS_LOCK_URL": stack.lock_url,
        # The operator's bearer token (a file, 0600): every operator command presents it.
        "PAYOUTS_OPERATOR_TOKEN_FILE": str(stack.credentials.operator_token_file),
        # Operator commands that check the token themselves (no server in between).
        "OUTBOX_CREDENTIALS_PATH": str(stack.credentials.servers["outbox-cli"]),
        "LOCK_CREDENTIALS_PATH": str(stack.credentials.servers["lock-server"]),
    }


async def _run(config: StackConfig, *, check: bool) -> int:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    stopping = False

    def on_signal(signum: int) -> None:
        nonlocal stopping
        if stopping:
            _say("already stopping; waiting for every child to exit")
            return
        stopping = True
        _say(f"{signal.Signals(signum).name}: stopping the stack")
        main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        async with Stack(config, progress=_say) as stack:
            _say("stack is up\n" + _summary(stack))
            _say("\nfor the payouts commands in another shell:\n" + exports(stack))
            if config.fencing is False:
                _say("WARNING: fencing is OFF (FR-29): experiment mode only")
            if not check:
                _say("press Ctrl-C to stop")
                await asyncio.Event().wait()
            stopping = True  # a Ctrl-C from here on must not interrupt the orderly stop
        return 0
    except asyncio.CancelledError:
        _say("stack stopped")
        return 130
    except StackError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _cmd_up(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {
        "workers": args.workers,
        "backend": args.backend,
        "run_dir": Path(args.run_dir),
        "fencing": args.fencing == "on",
    }
    if args.health_timeout is not None:
        overrides["health_timeout_s"] = args.health_timeout
    try:
        config = StackConfig.from_env(**overrides)
    except StackError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    # Humans read the progress lines on stdout; the JSON events go beside the children's logs.
    events = config.run_dir / "logs" / "stack.log"
    events.parent.mkdir(parents=True, exist_ok=True)
    with open(events, "a", encoding="utf-8") as stream:
        configure_logging("stack", stream=stream)
        # Health polling would log one httpx line per probe; the stack's own events say enough.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        return asyncio.run(_run(config, check=args.check))


def register(subparsers: Any) -> None:
    up = subparsers.add_parser(
        "up",
        help="start the whole system locally (Temporal, PostgreSQL, etcd, services, workers)",
        description="Start the whole system on this machine and keep it running until Ctrl-C or "
        "SIGTERM, which stop every process it started. Prints each service's address.",
    )
    up.add_argument("--workers", type=int, default=1, help="number of workers (default 1)")
    up.add_argument(
        "--backend", choices=["postgres", "etcd"], default="postgres", help="lock backend"
    )
    up.add_argument(
        "--run-dir",
        default=str(DEFAULT_RUN_DIR),
        help=f"logs and state (default {DEFAULT_RUN_DIR})",
    )
    up.add_argument(
        "--fencing",
        choices=["on", "off"],
        default="on",
        help="off disables fencing at the rail proxy and in workers: experiment only (FR-29)",
    )
    up.add_argument(
        "--check", action="store_true", help="start, verify health, print addresses, stop, exit 0"
    )
    up.add_argument("--health-timeout", type=float, help="seconds per service (default 60)")
    up.set_defaults(func=_cmd_up)
