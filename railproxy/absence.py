"""The absence rule: when a rail's `not_found` proves that an instruction never reached it.

Declaring a payout absent lets it end FAILED, and a FAILED payout whose instruction did reach the
rail is money gone while our ledger says nothing moved. So absence is claimed only on the rail's
own consistency statement, widened by the Connection's margins (docs/rail.md):

    complete_from    <= earliest attempt recorded_at - clock-skew margin
    complete_through >= latest attempt deadline_at  + ingest bound + clock-skew margin

An attempt is recorded (database clock) before any byte is forwarded, and forwarded only until its
deadline; the ingest bound covers a request the rail ingests after that, the skew margin the
difference between the rail's clock and ours. Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from railproxy.models import AttemptRecord, Outcome


@dataclass(frozen=True)
class Verdict:
    absent: bool
    reason: str


def judge(
    attempts: Sequence[AttemptRecord],
    complete_from: datetime | None,
    complete_through: datetime | None,
    *,
    ingest_bound_s: float,
    skew_margin_s: float,
) -> Verdict:
    """Whether a `not_found` for these attempts' reference proves that none reached the rail."""
    if not attempts:
        # No attempt recorded yet: one may still be recorded and forwarded; nothing to bound.
        return Verdict(False, "no recorded attempt for this reference")
    answered = (Outcome.ACKED, Outcome.DECLINED)
    acknowledged = [a.attempt_id for a in attempts if a.outcome in answered]
    if acknowledged:
        return Verdict(False, f"the rail acknowledged attempt {acknowledged[0]}")
    if complete_from is None or complete_through is None:
        return Verdict(False, "the rail stated no completeness window")
    skew = timedelta(seconds=skew_margin_s)
    earliest = min(a.recorded_at for a in attempts)
    latest = max(a.deadline_at for a in attempts)
    if complete_from > earliest - skew:
        return Verdict(
            False,
            f"the rail's records begin at {complete_from.isoformat()}, not before the attempt "
            f"recorded at {earliest.isoformat()} by the skew margin",
        )
    needed = latest + timedelta(seconds=ingest_bound_s) + skew
    if complete_through < needed:
        return Verdict(
            False,
            f"the rail is complete through {complete_through.isoformat()}, "
            f"not yet {needed.isoformat()} (deadline + ingest bound + skew margin)",
        )
    return Verdict(
        True,
        f"not found; the rail is complete from {complete_from.isoformat()} through "
        f"{complete_through.isoformat()}, covering attempts recorded from {earliest.isoformat()} "
        f"with deadline {latest.isoformat()} and both margins",
    )
