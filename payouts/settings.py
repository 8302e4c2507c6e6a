"""Where the `payouts` commands find what they drive: an option, else an environment variable,
else the local stack's default address.

Owns: the connection options every command shares (`connection_options`) and their look-ups
(`database_url`, `temporal_address`, `task_queue`, `lock_url`). Must never: connect to anything,
or be imported by a component (components read their own settings classes).
"""

from __future__ import annotations

import argparse
import os

DEFAULT_TEMPORAL = "127.0.0.1:7233"
DEFAULT_QUEUE = "payouts"
DEFAULT_LOCK_URL = "http://127.0.0.1:8701"


def database_url(args: argparse.Namespace, *own_vars: str) -> str:
    """--database-url, else the command's own role DSN variable(s) (e.g. $PAYDB_DATABASE_URL,
    docs/database-roles.md), else $DATABASE_URL; a clear error when none is set."""
    url = getattr(args, "database_url", None)
    for var in (*own_vars, "DATABASE_URL"):
        url = url or os.environ.get(var)
    if not url:
        names = " or ".join(f"${v}" for v in (*own_vars, "DATABASE_URL"))
        raise SystemExit(f"error: {names} is not set (or pass --database-url)")
    return str(url)


def temporal_address(args: argparse.Namespace) -> str:
    return str(
        getattr(args, "temporal", None) or os.environ.get("TEMPORAL_ADDRESS", DEFAULT_TEMPORAL)
    )


def task_queue(args: argparse.Namespace) -> str:
    return str(
        getattr(args, "task_queue", None) or os.environ.get("WORKER_TASK_QUEUE", DEFAULT_QUEUE)
    )


def lock_url(args: argparse.Namespace) -> str:
    return str(args.lock_url or os.environ.get("LOCK_URL", DEFAULT_LOCK_URL))


def connection_options(
    p: argparse.ArgumentParser, *, db: bool = False, temporal: bool = False
) -> None:
    """The connection options a command needs."""
    if db:
        p.add_argument("--database-url", help="defaults to $PAYDB_DATABASE_URL, else $DATABASE_URL")
    if temporal:
        p.add_argument(
            "--temporal",
            help=f"Temporal address (default $TEMPORAL_ADDRESS or {DEFAULT_TEMPORAL})",
        )
        p.add_argument("--task-queue", help=f"default $WORKER_TASK_QUEUE or {DEFAULT_QUEUE}")
