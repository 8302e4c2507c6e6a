"""How a `payouts payout|seed|lock` command fails: one line on stderr and a documented exit code.

Owns: the exit codes (README), `CommandError`, the `guard` that turns expected failures into
them, and what a failed Temporal signal or query means to the operator. Must never: retry, or
hide an unexpected error (that is `payouts.cli.main`'s one line and exit 1).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import asyncpg

#: Exit codes of `payouts payout|seed|lock` commands (documented in the README).
EXIT_USAGE = 2  # bad arguments or input; nothing was changed
EXIT_NOT_FOUND = 3  # no such payout (no workflow for it)
EXIT_CONFLICT = 4  # the payout's workflow has completed: nothing left to signal
EXIT_UNAVAILABLE = 5  # Temporal, the database or the lock server could not be reached
EXIT_NOT_TERMINAL = 6  # `payout create --wait`: some payouts were not terminal in time


class CommandError(Exception):
    """A user-facing error: printed as one line on stderr, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def require(value: str | None, what: str) -> str:
    if not value or not value.strip():
        raise CommandError(f"--{what} is required and must not be blank")
    return value.strip()


def workflow_error(exc: Exception, payout_id: str) -> CommandError:
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
        return CommandError(f"Temporal is unreachable: {text[:120]}", EXIT_UNAVAILABLE)
    return CommandError(f"payout {payout_id}: {type(exc).__name__}: {text[:160]}", 1)


def guard(func: Any) -> Any:
    """One line on stderr and the documented exit code for every expected failure."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except CommandError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return exc.code
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if getattr(args, "debug", False):
                raise
            sys.stderr.write(
                f"error: the database could not be used: {type(exc).__name__}: {exc}\n"
            )
            return EXIT_UNAVAILABLE

    return run
