"""`python -m outbox`: run one outbox publisher until SIGINT/SIGTERM (settings from OUTBOX_* env).

The DSN is $OUTBOX_DATABASE_URL, else $DATABASE_URL; one that would cross a network unverified
is refused (exit 2) before anything connects (common.tls.database_url_problem). `payouts outbox
run` is the same publisher with a `--database-url` option.
"""

from __future__ import annotations

import os

from common.exiting import exit_code, exit_now, refuse
from common.tls import database_url_problem
from outbox.service import load_publisher_settings, run_publisher

DSN_VARIABLES = ("OUTBOX_DATABASE_URL", "DATABASE_URL")


def database_url() -> str:
    """The first of DSN_VARIABLES that is set, checked; else a refusal (exit 2)."""
    for variable in DSN_VARIABLES:
        url = os.environ.get(variable)
        if url:
            problem = database_url_problem(url, variable)
            if problem:
                refuse("outbox", problem)
            return url
    refuse("outbox", " or ".join(f"${v}" for v in DSN_VARIABLES) + " is not set")


def main() -> int:
    settings = load_publisher_settings()
    return run_publisher(database_url(), settings)


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as exc:  # a refusal, already printed
        code = exit_code(exc)
    exit_now(code)  # the spans still queued are exported first (common.tracing)
