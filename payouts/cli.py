"""The `payouts` command line. Every subcommand is documented in the README.

Components register their own subcommands (`register(subparsers)` in the modules listed in
COMMAND_MODULES), so this file stays a router and each command lives beside the code it drives.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys

#: Modules that define `register(subparsers: argparse._SubParsersAction) -> None`.
COMMAND_MODULES: tuple[str, ...] = (
    "payouts.commands",
    "payouts.experiments_cli",
    "payouts.demo_cli",
    "payouts.stack_cli",
    "ledger.reconcile_cli",
    "ledger.invariants_cli",
    "ledger.outbox_cli",
    "payouts.chaos_cli",
)


def database_url(args: argparse.Namespace) -> str:
    """--database-url, else $DATABASE_URL; a clear error when neither is set."""
    url = getattr(args, "database_url", None) or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("error: DATABASE_URL is not set (or pass --database-url)")
    return str(url)


def _cmd_db_migrate(args: argparse.Namespace) -> int:
    from payouts.migrate import migrate

    applied = asyncio.run(migrate(database_url(args)))
    print("\n".join(applied) if applied else "database is up to date")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="payouts", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="payment database administration")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    mig = db_sub.add_parser("migrate", help="apply pending schema migrations of every component")
    mig.add_argument("--database-url", help="defaults to $DATABASE_URL")
    mig.set_defaults(func=_cmd_db_migrate)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
