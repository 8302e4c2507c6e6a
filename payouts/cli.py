"""The `payouts` command line, the operator's. Every subcommand is documented in the README.

Components register their own subcommands (the `register(subparsers)` functions in
COMMAND_GROUPS), so this file stays a router and each command lives beside the code it drives.
The lab's commands (demo, experiments, chaos, game day) are not here: they have their own entry,
`payouts-lab` (`python -m lab`, lab/cli.py), which reuses `dispatch` and `run_console` below.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from common.exiting import exit_code, exit_now
from payouts import commands, invariants_cli, outbox_cli, reconcile_cli
from payouts.errors import (
    EXIT_CLOSED_OUTPUT,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CommandError,
    OneLineParser,
)
from payouts.settings import database_url, load_stack_env
from stack import cli as stack_cli

__all__ = [
    "HelpFormatter",
    "build_parser",
    "dispatch",
    "main",
    "run",
    "run_console",
    "use_help_formatter",
]

#: Each adds its subcommands to the subparsers it is given, in the order of `--help`.
COMMAND_GROUPS: tuple[Callable[[Any], None], ...] = (
    commands.register,
    stack_cli.register,
    reconcile_cli.register,
    invariants_cli.register,
    outbox_cli.register,
)


def _cmd_db_migrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from common.db_roles import RoleConfigError, read_passwords
    from common.migrate import MigrationError, migrate

    folder = args.role_passwords or os.environ.get("DB_ROLE_PASSWORDS_DIR")
    try:
        passwords = read_passwords(Path(folder)) if folder else None
        applied = asyncio.run(migrate(database_url(args), passwords=passwords))
    except (RoleConfigError, MigrationError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    print("\n".join(applied) if applied else "database is up to date")
    return 0


class HelpFormatter(argparse.HelpFormatter):
    """Every option shows its default, unless its help already says it or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def use_help_formatter(parser: OneLineParser) -> None:
    """Apply `HelpFormatter` to a parser and all of its subcommands, however deep."""
    parser.formatter_class = HelpFormatter
    for child in parser.subcommands.values():
        use_help_formatter(child)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(  # its subparsers are OneLineParsers too (argparse's parser_class)
        prog="payouts",
        description="Exactly-once payout execution: run the local stack, create and follow "
        "payouts, and operate them (the lab's demo, experiments and chaos: payouts-lab).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--debug", action="store_true", help="show a traceback for an unexpected error"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="payment database administration")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    mig = db_sub.add_parser("migrate", help="apply pending schema migrations of every component")
    mig.add_argument("--database-url", help="the admin DSN; defaults to $DATABASE_URL")
    mig.add_argument(
        "--role-passwords",
        help="directory of per-role password files, 0600 (default $DB_ROLE_PASSWORDS_DIR; "
        "unset: role passwords are left as they are)",
    )
    mig.set_defaults(func=_cmd_db_migrate)

    for register in COMMAND_GROUPS:
        register(sub)
    use_help_formatter(parser)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fenced-payouts")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


def dispatch(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse `argv` and run the chosen subcommand's `func`; its exit code, or 1 and one line
    for an unexpected error (`--debug`: the traceback)."""
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit:
        raise
    except BrokenPipeError:
        raise  # `run` ends quietly
    except CommandError as exc:  # e.g. a missing $DATABASE_URL in a command without a guard
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:
        # An unexpected error is one line and exit 1; --debug shows the traceback.
        if args.debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (run with --debug for details)", file=sys.stderr)
        return 1


def run() -> None:
    """Console entry point of `payouts`: `run_console(main)`."""
    run_console(main)


def run_console(main: Callable[[], int]) -> None:
    """A console entry point: `main()`, then `exit_now` with its code, so that the exit code is
    the command's own and never a crash of the Temporal SDK at interpreter exit (common.exiting).

    A reader that went away (`payouts payout status P | head`) ends the command quietly with
    EXIT_CLOSED_OUTPUT, the usual convention: no message, which would only go to a pipe nobody
    reads or clutter the terminal."""
    try:
        load_stack_env(sys.argv[1:])  # a running stack's addresses, for the unset variables
        code = main()
    except CommandError as exc:  # the stack's environment file is unreadable
        print(f"error: {exc}", file=sys.stderr)
        code = exc.code
    except SystemExit as exc:
        code = exit_code(exc)
    except BrokenPipeError:
        _drop_stdout()
        code = EXIT_CLOSED_OUTPUT
    exit_now(code)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that flushing what is still buffered cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    run()
