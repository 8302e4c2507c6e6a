"""How a `payouts` command fails: one line on stderr and an exit code from the one table.

Owns: the exit-code table (`EXIT_TABLE`, rendered into the README), `CommandError`, the `guard`
that turns expected failures into their codes, `OneLineParser` (an argument error is one line
and a hint, exit 2), `temporal_unreachable` and what a failed Temporal signal or query means to
the operator. Must never: retry, or hide an unexpected error (that is `payouts.cli.main`'s one
line and exit 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import asyncpg


@dataclass(frozen=True)
class ExitCode:
    code: int
    name: str
    meaning: str


#: Every exit code of `payouts ...` and `payouts-lab ...`, defined once: the README's table is
#: this list (tests/payouts/test_exit_table.py checks both the README and each command against
#: it).
EXIT_TABLE: tuple[ExitCode, ...] = (
    ExitCode(0, "ok", "done"),
    ExitCode(
        1,
        "failed",
        "unexpected error (one line; `--debug` shows the traceback), or a check found a problem "
        "(`reconcile run`, `check-invariants`; `payouts-lab` `demo`, `experiment`, `chaos`, "
        "`gameday`)",
    ),
    ExitCode(
        2,
        "usage",
        "bad arguments or input (an unknown option, a blank id, an amount out of range, a "
        "missing `DATABASE_URL`), or the Temporal reached is not the database's stack: "
        "nothing was changed",
    ),
    ExitCode(
        3,
        "not_found",
        "no such payout (no workflow, no row; `payout trace`: no trace of it), or no lock "
        "holder to revoke",
    ),
    ExitCode(
        4,
        "conflict",
        "refused: the payout's workflow has completed (nothing to signal), or the workflow "
        "refused the operator command",
    ),
    ExitCode(5, "unavailable", "Temporal, the database or the lock server could not be reached"),
    ExitCode(6, "not_terminal", "`payout create --wait` ended before every payout was terminal"),
    ExitCode(130, "interrupted", "interrupted (Ctrl-C)"),
    ExitCode(
        141,
        "closed_output",
        "the reader of the output went away (the output piped into `head`): the rest is "
        "dropped quietly, as by a process that SIGPIPE ended",
    ),
)
EXIT = {e.name: e.code for e in EXIT_TABLE}

EXIT_USAGE = EXIT["usage"]  # bad arguments or input; nothing was changed
EXIT_NOT_FOUND = EXIT["not_found"]  # no such payout (no workflow for it), no lock holder
EXIT_CONFLICT = EXIT["conflict"]  # the payout's workflow has completed, or a command refused
EXIT_UNAVAILABLE = EXIT["unavailable"]  # Temporal, the database or the lock server unreachable
EXIT_NOT_TERMINAL = EXIT["not_terminal"]  # `payout create --wait`: some were not terminal in time
EXIT_INTERRUPTED = EXIT["interrupted"]
EXIT_CLOSED_OUTPUT = EXIT["closed_output"]


def exit_table_markdown() -> str:
    """The README's table (between its `exit-codes` markers), rendered from EXIT_TABLE."""
    rows = [f"| `{e.code}` | {e.name} | {e.meaning} |" for e in EXIT_TABLE]
    return "\n".join(["| code | name | meaning |", "|---|---|---|", *rows])


class CommandError(Exception):
    """A user-facing error: printed as one line on stderr, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class OneLineParser(argparse.ArgumentParser):
    """An argument error is one line and a hint on stderr, exit 2 (not the whole usage). The
    hint names the deepest subcommand given (`payouts payout create --help`), also for an
    unrecognized option, which argparse reports from the top parser.

    It keeps its subcommands' parsers (`subcommands`): argparse hands them out only on the action
    `add_subparsers` returns. Its subcommands are OneLineParsers too (argparse's `parser_class`
    defaults to the parent's class), so the whole tree can be walked through `subcommands`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._words: list[str] = []
        self._subcommands: dict[str, OneLineParser] = {}

    def add_subparsers(self, **kwargs: Any) -> Any:
        """argparse's `add_subparsers`; the action's `choices` is the dict its `add_parser` fills
        (name or alias: parser), kept as `subcommands`."""
        action = super().add_subparsers(**kwargs)
        self._subcommands = action.choices
        return action

    @property
    def subcommands(self) -> Mapping[str, OneLineParser]:
        """Each subcommand's parser by its name (and by each alias); empty for a leaf command."""
        return self._subcommands

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._words = [str(w) for w in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        prog = _deepest_prog(self, self._words)
        self.exit(EXIT_USAGE, f"usage error: {message}; see `{prog} --help`\n")


def _deepest_prog(parser: OneLineParser, argv: list[str]) -> str:
    """The `prog` of the deepest subcommand that the words of `argv` name, from `parser`."""
    for word in argv:
        child = parser.subcommands.get(word)
        if child is not None:
            return _deepest_prog(child, argv[argv.index(word) + 1 :])
    return parser.prog


def payout_id_arg(value: str) -> str:
    """A payout id argument: as `payout list` prints it too (the workflow id `payout-<id>`
    is resolved by `payouts.workload.find_payout`); blank is a usage error."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the payout id must not be blank")
    return value.strip()


def temporal_unreachable(address: str, detail: str) -> CommandError:
    """Temporal at `address` could not be reached: where the address came from, and the SDK's
    own first line, whole."""
    return CommandError(
        f"Temporal at {address} is unreachable ({detail}); the address comes from --temporal, "
        "else $TEMPORAL_ADDRESS, else the stack's environment file "
        "(`payouts up` writes RUN/stack.env), else 127.0.0.1:7233",
        EXIT_UNAVAILABLE,
    )


def require(value: str | None, what: str) -> str:
    if not value or not value.strip():
        raise CommandError(f"--{what} is required and must not be blank")
    return value.strip()


def workflow_error(exc: Exception, payout_id: str, address: str = "") -> CommandError:
    """What a failed signal or query means to the operator, as a one-line error."""
    from temporalio.service import RPCError, RPCStatusCode

    text = str(exc)
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
        if "completed" in text:
            return CommandError(
                f"payout {payout_id}: its workflow has completed; nothing to do", EXIT_CONFLICT
            )
        return CommandError(
            f"unknown payout {payout_id} (no workflow payout-{payout_id})", EXIT_NOT_FOUND
        )
    if isinstance(exc, RPCError) and exc.status == RPCStatusCode.UNAVAILABLE:
        return temporal_unreachable(address or "its address", text.splitlines()[0] if text else "")
    return CommandError(f"payout {payout_id}: {type(exc).__name__}: {text}", 1)


def guard(func: Any) -> Any:
    """One line on stderr and the documented exit code for every expected failure."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except CommandError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return exc.code
        except BrokenPipeError:
            raise  # the reader went away: `payouts.cli.run` ends quietly (EXIT_CLOSED_OUTPUT)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if getattr(args, "debug", False):
                raise
            sys.stderr.write(
                f"error: the database could not be used: {type(exc).__name__}: {exc}\n"
            )
            return EXIT_UNAVAILABLE

    return run
