"""One payout worker process (`python worker_main.py`): its settings, its start-up refusals, its
Temporal telemetry, the clients and pools it builds, and the Temporal workers it registers.

Owns: reading `WorkerSettings` once (`worker.settings`), refusing to start with fencing or
verification off outside a verified experiment (`worker.startup`, FR-29), building the lock
session, the payment store, the rail proxy client and the activities over them
(`worker.process`), and the one list of workflows and activities each task queue runs
(`worker.registration`). Must never: be imported by a component, a workflow or an activity (it
sits above them, below the CLI, the stack and the lab), or start anything before `check_start`
has passed.
"""
