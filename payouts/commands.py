"""Operator and workload commands: `payouts seed`, `payouts payout create|start-pending|list|
status|show|abandon|revoke|trace`, `payouts audit`, `payouts lock revoke`.

`register` fans out to the command groups: `payouts.seed_cli`, `payouts.payout_cli`,
`payouts.status_cli` (status, show, audit), `payouts.operator_cli` (the signals and the lock
revoke) and `payouts.trace_cli`. Their shared
parts live in `payouts.settings` (connection options), `payouts.errors` (exit codes),
`payouts.batch` (input), `payouts.workload` (accounts, rows, workflows) and `payouts.follow`
(`--wait`); the names below are re-exported for callers that import the workload API from here.
"""

from __future__ import annotations

from typing import Any

from payouts import operator_cli, payout_cli, seed_cli, status_cli, trace_cli
from payouts.batch import MAX_BATCH, PayoutSpec, check_batch, generate, read_batch
from payouts.errors import (
    EXIT_CONFLICT,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
)
from payouts.follow import follow_payouts, payout_state_counts
from payouts.settings import DEFAULT_QUEUE, DEFAULT_TEMPORAL, task_queue, temporal_address
from payouts.workload import (
    connect_temporal,
    create_payouts,
    seed_accounts,
    start_workflows,
    stranded_payouts,
)

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_TEMPORAL",
    "EXIT_CONFLICT",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "MAX_BATCH",
    "CommandError",
    "PayoutSpec",
    "check_batch",
    "connect_temporal",
    "create_payouts",
    "follow_payouts",
    "generate",
    "payout_state_counts",
    "read_batch",
    "register",
    "seed_accounts",
    "start_workflows",
    "stranded_payouts",
    "task_queue",
    "temporal_address",
]


def register(sub: Any) -> None:
    seed_cli.register(sub)
    payout_sub = payout_cli.register(sub)
    status_cli.register(payout_sub, sub)
    operator_cli.register_signals(payout_sub)
    trace_cli.register(payout_sub)
    operator_cli.register(sub)
