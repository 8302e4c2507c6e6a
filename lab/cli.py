"""The lab's command line, `payouts-lab` (`python -m lab`): the runs that prove the design.

Its subcommands are the demo (what `make demo` runs), the pause and crash experiments, the seeded
chaos run, the game day and the Temporal UI screenshots; each registers itself from its own
subpackage (`lab.*.cli`). The operator's `payouts` command never loads any of them: the lab sits
above `payouts/` and `stack/` (docs/architecture.md, "Layout and ownership"), and reuses the
router's parsing, error and exit handling (`payouts.cli.dispatch`, `payouts.cli.run_console`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lab.chaos import cli as chaos_cli
from lab.demo import cli as demo_cli
from lab.experiments import cli as experiments_cli
from lab.gameday import cli as gameday_cli
from lab.screenshots import cli as screenshots_cli
from payouts.cli import dispatch, run_console, use_help_formatter
from payouts.errors import OneLineParser

__all__ = ["COMMAND_GROUPS", "build_parser", "main", "run"]

#: Each adds its subcommand to the subparsers it is given, in the order of `--help`.
COMMAND_GROUPS: tuple[Callable[[Any], None], ...] = (
    demo_cli.register,
    experiments_cli.register,
    chaos_cli.register,
    gameday_cli.register,
    screenshots_cli.register,
)


def build_parser() -> OneLineParser:
    parser = OneLineParser(  # its subparsers are OneLineParsers too (argparse's parser_class)
        prog="payouts-lab",
        description="Prove the design by running it on a private local stack: the demo, the "
        "pause and crash experiments, seeded chaos, the game day, the Temporal UI screenshots.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show a traceback for an unexpected error"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for register in COMMAND_GROUPS:
        register(sub)
    use_help_formatter(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


def run() -> None:
    """Console entry point of `payouts-lab`, with the exit handling of `payouts`."""
    run_console(main)
