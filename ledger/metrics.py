"""Prometheus metrics of the payment database. No label carries an id, key, account or token
(NFR-09): labels are the operation name and state names only, all from closed sets.

Module-level collectors are the prometheus-client convention (one registry per process); they
are constants in the sense that matters: created once at import, never rebound.
"""

from __future__ import annotations

from prometheus_client import Counter

FENCED_OUT = Counter(
    "paydb_fenced_out_total",
    "Writes to the payment database rejected because the presented token was below the fence.",
    ["operation"],
)
GRANT_REFUSED = Counter(
    "paydb_grant_refused_total",
    "Fenced writes refused because the grant was not the lock service's for the write (INV-07).",
    ["operation", "reason"],
)
TRANSITIONS = Counter(
    "paydb_payout_transitions_total",
    "Payout state transitions committed.",
    ["from_state", "to_state"],
)
ALREADY_ADVANCED = Counter(
    "paydb_already_advanced_total",
    "Payout writes that found the payout already moved on by another holder (not an error).",
    ["operation"],
)
LEDGER_GROUPS = Counter(
    "paydb_ledger_groups_total",
    "Balanced ledger groups written.",
    ["kind"],
)
