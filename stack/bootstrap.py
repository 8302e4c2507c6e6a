"""What the local stack does against its own services once they answer: mark its payment database
and Temporal namespace as one stack, make the reconcile Schedule, and wait until the rail stub's
records reach back past the rail proxy's clock-skew margin.

Owns: those three steps, each a call to a running service. Must never: start or stop a process
(stack.system does), or let a workload start before the rail's history covers the absence rule's
margin.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import httpx

from railproxy.settings import ProxySettings

__all__ = ["ensure_reconcile_schedule", "mark_stack", "wait_for_rail_history"]

#: The proxy setting whose value the workload waits out (see `wait_for_rail_history`).
_SKEW_MARGIN_ENV = "RAILPROXY_ABSENCE_CLOCK_SKEW_MARGIN_S"


async def mark_stack(database_url: str, temporal_address: str) -> str:
    """One new stack id in this stack's payment schema and Temporal namespace, so that a
    command can tell that the two it reaches belong together (common.stackmark); the id."""
    from temporalio.client import Client

    from common.stackmark import mark_database, mark_temporal

    stack_id = os.urandom(6).hex()
    await mark_database(database_url, stack_id)
    await mark_temporal(await Client.connect(temporal_address), stack_id)
    return stack_id


async def ensure_reconcile_schedule(temporal_address: str, every_s: float, task_queue: str) -> str:
    """The Temporal Schedule `reconcile-hourly`, as compose's `reconcile-schedule` job makes
    it: scheduled reconciliation runs in this stack's workers, visible in its Web UI. Returns
    the line that says so."""
    # Imported here: the Schedule's workflow and settings modules take ~0.5 s to import,
    # which every `payouts` command would pay (payouts.cli loads stack.cli, hence this).
    from temporalio.client import Client

    from reconcile.reconciler import ReconcileSettings
    from workflows.reconcile_schedule import SCHEDULE_ID, ensure_schedule

    client = await Client.connect(temporal_address)
    await ensure_schedule(
        client,
        every=timedelta(seconds=every_s),
        task_queue=task_queue,
        settle_lag_s=ReconcileSettings().settle_lag_s,
    )
    return f"Temporal Schedule {SCHEDULE_ID}: ReconcileWorkflow every {every_s:g}s"


async def wait_for_rail_history(
    *,
    railstub_url: str,
    operator_headers: Mapping[str, str],
    verify: ssl.SSLContext | bool,
    railproxy_env: Mapping[str, str],
    progress: Callable[[str], None],
) -> float:
    """Wait until the rail stub's records begin earlier than the proxy's clock-skew margin.

    The absence rule (railproxy.absence) proves a payout absent only if the rail's records
    begin at least the skew margin before the attempt; the stub's log begins when the stack
    first started it. A workload started sooner would leave every lost instruction of its
    first seconds ambiguous for good, so demo and chaos wait this out (seconds waited).
    """
    margin = float(
        railproxy_env.get(_SKEW_MARGIN_ENV)
        or os.environ.get(_SKEW_MARGIN_ENV)
        or ProxySettings.model_fields["absence_clock_skew_margin_s"].default
    )
    async with httpx.AsyncClient(
        base_url=railstub_url,
        timeout=5.0,
        headers=dict(operator_headers),
        verify=verify,
    ) as http:
        response = await http.get("/admin/movements", params={"client_reference": "-"})
        response.raise_for_status()
        since = datetime.fromisoformat(response.json()["complete_from"])
    wait_s = (since - datetime.now(UTC)).total_seconds() + margin + 1.0
    if wait_s > 0:
        progress(
            f"waiting {wait_s:.0f}s until the rail's records reach back past the "
            f"{margin:.0f}s clock-skew margin of the absence rule"
        )
        await asyncio.sleep(wait_s)
    return max(0.0, wait_s)
