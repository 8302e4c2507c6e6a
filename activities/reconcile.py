"""The `reconcile` activity: runs the read-only reconciler over one closed window.

Owns: turning a ReconcileRequest into one `reconcile.reconciler.reconcile` call on a pooled
connection. Must never: write to any schema or repair a break (the reconciler's transaction is
READ ONLY); it is safe to retry because it only reads.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import RECONCILE
from activities.reconcile_models import ReconcileReport, ReconcileRequest
from reconcile.reconciler import (
    InvalidWindow,
    MovementSource,
    Window,
    WindowNotClosed,
    reconcile,
)


class ReconcileActivities:
    def __init__(
        self,
        pool: asyncpg.Pool,
        movement_source: MovementSource,
        sla: timedelta = timedelta(hours=4),  # ambiguity resolution SLA
    ) -> None:
        self._pool = pool
        self._movement_source = movement_source
        self._sla = sla

    @property
    def pool(self) -> asyncpg.Pool:
        """The reconciler's read-only pool (also the re-drive's: it only reads paydb)."""
        return self._pool

    @activity.defn(name=RECONCILE)
    async def reconcile(self, req: ReconcileRequest) -> ReconcileReport:
        try:
            window = Window(
                start=datetime.fromisoformat(req.window_start),
                end=datetime.fromisoformat(req.window_end),
            )
        except ValueError as exc:
            raise ApplicationError(str(exc), type="InvalidWindow", non_retryable=True) from exc
        try:
            async with self._pool.acquire() as conn:
                report = await reconcile(
                    conn,
                    self._movement_source,
                    window,
                    ambiguity_sla=self._sla,
                    sample_size=req.sample_size,
                )
        except (InvalidWindow, WindowNotClosed) as exc:
            # Retrying cannot fix a bad window; a missing movement log or a database blip can.
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from exc
        return ReconcileReport(
            window_start=report.window.start.isoformat(),
            window_end=report.window.end.isoformat(),
            counts=dict(report.counts),
            samples={k: list(v) for k, v in report.samples.items()},
            checked_payouts=report.checked_payouts,
            ok=report.ok,
        )
