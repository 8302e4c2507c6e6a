"""Where the `payouts` commands find what they drive: an option, else an environment variable,
else the running local stack's environment file, else the local stack's default address.

Owns: the connection options every command shares (`connection_options`), their look-ups
(`database_url`, `temporal_address`, `task_queue`, `lock_url`) and `load_stack_env`: for an
operator command, every variable of `RUN/stack.env` (`$PAYOUTS_ENV_FILE`, else
`.run/stack/stack.env`, the file `payouts up` writes) that is unset here is taken from it, and the
command says so on stderr; a variable set here wins. Must never: connect to anything, or be
imported by a component (components read their own settings classes).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from common.tls import database_url_problem
from payouts.errors import EXIT_USAGE, CommandError

DEFAULT_TEMPORAL = "127.0.0.1:7233"
DEFAULT_QUEUE = "payouts"
DEFAULT_LOCK_URL = "http://127.0.0.1:8701"
#: The environment file of a stack started with `payouts up`'s default RUN (stack.config).
DEFAULT_ENV_FILE = Path(".run/stack/stack.env")
#: The top-level commands that drive a running stack: they read its environment file. Not `up`,
#: `demo`, `chaos`, ...: they start a stack of their own.
STACK_COMMANDS = frozenset(
    {"db", "seed", "payout", "audit", "lock", "reconcile", "check-invariants", "outbox"}
)
#: The variables the note on stderr names, when they came from the file.
_NAMED = ("TEMPORAL_ADDRESS", "DATABASE_URL", "PAYDB_DATABASE_URL", "LOCK_URL")


def load_stack_env(argv: list[str], environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """For a stack command (`argv`'s first word), set every variable of the stack's environment
    file that `environ` lacks, and say on stderr which file was read; the file, or None."""
    from stack.envfile import EnvFileError, read_env_file

    words = [w for w in argv if not w.startswith("-")]
    if not words or words[0] not in STACK_COMMANDS:
        return None
    path = Path(environ.get("PAYOUTS_ENV_FILE") or DEFAULT_ENV_FILE)
    if not path.is_file():
        return None
    try:
        values = read_env_file(path)
    except (OSError, EnvFileError) as exc:
        raise CommandError(f"the stack environment file cannot be read: {exc}") from None
    added = [name for name in values if name not in environ]
    for name in added:
        environ[name] = values[name]
    if added:
        named = ", ".join(n for n in _NAMED if n in added) or f"{len(added)} variable(s)"
        sys.stderr.write(f"note: {named} from {path} (a variable set in the shell wins)\n")
    return path


def database_url(args: argparse.Namespace, *own_vars: str) -> str:
    """--database-url, else the command's own role DSN variable(s) (e.g. $PAYDB_DATABASE_URL,
    docs/database-roles.md), else $DATABASE_URL; a clear error when none is set, and a refusal
    (exit 2, before anything connects) of a DSN whose session could be read or redirected on the
    path, as the components refuse one (common.tls.database_url_problem, docs/security.md)."""
    url, source = getattr(args, "database_url", None), "--database-url"
    for var in (*own_vars, "DATABASE_URL"):
        if not url:
            url, source = os.environ.get(var), var
    if not url:
        names = " or ".join(f"${v}" for v in (*own_vars, "DATABASE_URL"))
        raise CommandError(f"{names} is not set (or pass --database-url)", EXIT_USAGE)
    problem = database_url_problem(str(url), source)
    if problem:
        raise CommandError(problem, EXIT_USAGE)
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
            help="Temporal address (default $TEMPORAL_ADDRESS, else the stack's environment "
            f"file, else {DEFAULT_TEMPORAL})",
        )
        p.add_argument("--task-queue", help=f"default $WORKER_TASK_QUEUE or {DEFAULT_QUEUE}")
