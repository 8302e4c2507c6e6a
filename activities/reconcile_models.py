"""Inputs and outputs of ReconcileWorkflow and its activity (UC-07, FR-26).

Pure data with defaults, safe to import from workflow code; no `from __future__ import
annotations` so that the Temporal data converter sees real types. Times are ISO-8601 strings
with a time zone (what the converter carries unambiguously).
"""

from dataclasses import dataclass, field


@dataclass
class ReconcileInput:
    """Input of ReconcileWorkflow, fixed by the Schedule's action.

    The window is [action_time - settle_lag - window, action_time - settle_lag): consecutive
    scheduled runs with window == the schedule interval cover time with no gap and no overlap.
    `window_end` set explicitly (ISO) overrides the computation, for a manual re-run.
    """

    window_s: float = 3600.0  # hourly
    settle_lag_s: float = 300.0  # let payouts that were mid-flight at the hour finish first
    window_end: str = ""
    #: Each run also re-drives up to this many stranded payouts (activities.redrive); 0: off.
    redrive_limit: int = 1000


#: The activity that re-drives stranded payouts (activities.redrive).
REDRIVE_STRANDED = "redrive_stranded_payouts"


@dataclass
class RedriveReport:
    """The payouts a run started a new workflow for: "payout_id:STATE:how the last one ended"."""

    redriven: list[str] = field(default_factory=list)
    scanned_limit: int = 0


@dataclass
class ReconcileRequest:
    """Input of the `reconcile` activity: one closed window."""

    window_start: str
    window_end: str
    sample_size: int = 10


@dataclass
class ReconcileReport:
    """What a reconciliation run found; every class key is always present (zeros included)."""

    window_start: str
    window_end: str
    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[str]] = field(default_factory=dict)
    checked_payouts: int = 0
    ok: bool = False
    #: Stranded payouts this run drove again (a person terminated or reset their workflow).
    redriven: list[str] = field(default_factory=list)
