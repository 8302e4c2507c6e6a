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
from stack.config import DEFAULT_RUN_DIR, MAX_REPLICAS, STANDBY_MODES, StackConfig, StackError
from stack.endpoints import endpoints
from stack.envfile import stack_environment
from stack.preflight import safe_url
from stack.system import Stack


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _summary(stack: Stack) -> str:
    rows = [
        ("Temporal", stack.temporal_address),
        ("Temporal Web UI", stack.ui_url),
        ("PostgreSQL", safe_url(stack.database_url)),
        ("lock server", f"{stack.lock_url} (backend {stack.config.backend})"),
        ("rail stub", stack.railstub_url),
        ("rail proxy", stack.railproxy_url),
    ]
    if stack.etcd_endpoints:
        rows.append(("etcd", ",".join(stack.etcd_endpoints)))
    if stack.finledger_url:
        rows.append(("finance ledger", stack.finledger_url))
    if stack.config.replicas > 1:
        rows.append(("balancer", f"HAProxy: {stack.config.replicas} replicas behind each URL"))
    for name, info in sorted(stack.processes.items()):
        rows.append((f"pid {name}", f"{info.pid}  log {info.log_path}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _endpoints_table(stack: Stack) -> str:
    """Every metrics and health endpoint with the Prometheus job that scrapes it."""
    rows = [
        (e.process, e.job, f"{e.url}/metrics" + (f"  {e.url}/health" if e.health else ""))
        for e in endpoints(stack)
    ]
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    return "\n".join(f"  {p.ljust(w1)}  job {j.ljust(w2)}  {u}" for p, j, u in rows)


def exports(stack: Stack) -> str:
    """Ready-to-paste `export` lines: every address a command needs, for this stack's ports."""
    env = export_env(stack)
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def export_env(stack: Stack) -> dict[str, str]:
    """The variables of the stack's environment file (the game day runs operator commands with
    them): stack.envfile.stack_environment."""
    return stack_environment(stack)


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
            _say(
                "\nmetrics and health endpoints (docs/local-stack.md, Ports):\n"
                + _endpoints_table(stack)
            )
            _say("\nfor the payouts commands in another shell:\n" + exports(stack))
            _say(f"\nthe same in one file (the runbooks' first step):\n  . {stack.env_file}")
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
        "postgres_standby": args.postgres_standby,
        "replicas": args.replicas,
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
        "--postgres-standby",
        choices=list(STANDBY_MODES),
        default="none",
        help="embedded PostgreSQL only: a streaming standby that a failover promotes; sync "
        "commits wait for it (nothing committed is lost), async is a negative control",
    )
    up.add_argument(
        "--replicas",
        type=int,
        default=1,
        help=f"lock servers, rail proxies and outbox publishers each (1..{MAX_REPLICAS}, "
        "default 1); above 1, HAProxy balances the lock and proxy ports over them",
    )
    up.add_argument(
        "--check", action="store_true", help="start, verify health, print addresses, stop, exit 0"
    )
    up.add_argument("--health-timeout", type=float, help="seconds per service (default 60)")
    up.set_defaults(func=_cmd_up)
