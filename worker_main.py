"""A payout worker process: the Temporal workflow worker and the activity workers, holder of one
lock session.

Two task queues per process (docs/architecture.md#workflow-shape, the samples-python
`worker_specific_task_queues` pattern): the shared queue (`WORKER_TASK_QUEUE`, default `payouts`)
runs workflows and the activities that need no grant (acquire, lookup, escalate, revoke); this
process's own queue runs the critical section (claim, submit, post, release) so that it executes
where the lock session lives. If this process dies, its queue goes silent and the workflows
re-acquire elsewhere with a higher token.

Run: `python worker_main.py` (settings from the environment, prefix `WORKER_`, and the reconciler's
`RECONCILE_*` variables for the ReconcileWorkflow activity it runs; see README). One settings
object, `WorkerSettings` (`worker.settings`), is read once at start and passed down. This file
is the entry and its main loop; the process itself is assembled in the `worker` package
(`worker.process`), which registers what each queue runs in one place (`worker.registration`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from common import eventloop, tracing
from common.exiting import exit_now, load_settings
from common.logs import configure_logging
from worker.process import run
from worker.settings import WorkerSettings, settings_help
from worker.startup import StartupRefused, check_start


def main(argv: list[str] | None = None) -> None:
    """`python worker_main.py [--help]`: run one worker until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python worker_main.py",
        description="A payout worker: runs payout and reconcile workflows and their activities, "
        "and holds this process's lock session. Configured by environment variables only.",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
    settings = load_settings("worker", WorkerSettings)
    eventloop.check("worker")
    # Checked first, before logging is configured, for a clean refusal (one line on stderr,
    # exit 2, nothing started); `run` checks again for any other caller.
    try:
        asyncio.run(check_start(settings))
    except StartupRefused as exc:
        sys.stderr.write(f"worker: {exc}\n")
        raise SystemExit(2) from None
    configure_logging("worker", service=True)
    tracing.setup("worker", instance=settings.worker_id)

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run(settings, stop)

    eventloop.run(_main())  # uvloop (common.eventloop)
    # Every resource is closed by now; skip the interpreter teardown that the Temporal SDK can
    # crash, so a clean stop exits 0 (common.exiting).
    exit_now(0)


if __name__ == "__main__":
    main()
