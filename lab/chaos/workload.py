"""A chaos run's payouts (lab.chaos.run): funded accounts and seeded payout rows, then their
workflows started under the fault schedule (the armed pause #0 first, the proxy fault's payout
held back), every fault fired, normal behaviour restored, and the payouts left to settle.

Owns: the workload and the order it starts in against the faults. Must never: repair what a
fault broke, or move money except through the system's entry points.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from lab.chaos.faults import FaultInjector
from lab.chaos.options import (
    ACCOUNT_BALANCE,
    ARMED_SUBMIT_DEADLINE_S,
    CHAOS_WORKFLOW,
    MAX_AMOUNT,
    MIN_AMOUNT,
    ChaosOptions,
)
from lab.chaos.rail import RAIL_BASELINE
from lab.chaos.replicas import HeldPayout
from lab.chaos.schedule import Fault
from lab.chaos.settle import monitor_progress, settle
from stack.system import Stack

if TYPE_CHECKING:
    from payouts.batch import PayoutSpec

__all__ = ["create_workload", "holds_back_one", "start_under_faults"]


def holds_back_one(schedule: list[Fault], opts: ChaosOptions) -> bool:
    """Whether the proxy fault gets the workload's last payout to start (lab.chaos.replicas)."""
    return opts.payouts > 2 and any(f.kind == "proxy_replica_kill" for f in schedule)


async def create_workload(
    url: str, opts: ChaosOptions, hold_back: bool
) -> tuple[str, list[PayoutSpec]]:
    """Funded accounts under a fresh prefix and the run's seeded payout rows (no workflows yet).
    With `hold_back`, the last payout is moved to an account of its own (`<prefix>k00000`): its
    lock is free when the proxy fault starts it, so its submission comes within seconds."""
    from payouts.batch import generate
    from payouts.workload import create_payouts, seed_accounts

    prefix = f"c{opts.seed}-{uuid.uuid4().hex[:6]}-"
    await seed_accounts(url, opts.accounts, ACCOUNT_BALANCE, prefix)
    specs = generate(
        opts.payouts,
        opts.accounts,
        seed=opts.seed,
        min_amount=MIN_AMOUNT,
        max_amount=MAX_AMOUNT,
        account_prefix=prefix,
    )
    if hold_back:
        (own,) = await seed_accounts(url, 1, ACCOUNT_BALANCE, f"{prefix}k")
        specs[-1] = replace(specs[-1], account_id=own)
    await create_payouts(url, specs)
    return prefix, specs


async def start_under_faults(
    stack: Stack,
    injector: FaultInjector,
    opts: ChaosOptions,
    schedule: list[Fault],
    specs: list[PayoutSpec],
    *,
    prefix: str,
    done: list[bool],
    hold_back: bool,
    progress: Callable[[str], None],
) -> bool:
    """Start the fleet and the workflows, fire every fault, restore, settle; True if settled.
    With `hold_back`, the last payout waits for the proxy fault (lab.chaos.replicas)."""
    from payouts.workload import start_workflows

    await injector.rail(RAIL_BASELINE)
    # Fault #0, the armed pause, by construction (the fencing-off control rests on it): its
    # worker starts alone and is handed the workload's first payout, so it is the one that
    # claims it and freezes just before submitting; the fleet and the rest of the workload start
    # only then. That payout's submit deadline is long (ARMED_SUBMIT_DEADLINE_S): the frozen
    # request is thawed only once a newer holder's submission of it is recorded (chaos_faults),
    # and however slow the takeover (a loaded machine, an open breaker, an outage) its request
    # must still be inside its deadline then, to reach the fence checks.
    armed = await injector.arm(schedule[0])
    # The absence rule proves nothing about times before the rail's records begin (minus
    # its skew margin): a workload started sooner would leave lost instructions ambiguous.
    await stack.wait_for_rail_history()
    progress(f"starting {opts.payouts} payout workflows on {opts.accounts} accounts")
    address, queue = stack.temporal_address, stack.config.task_queue
    first = {**CHAOS_WORKFLOW, "submit_deadline_s": ARMED_SUBMIT_DEADLINE_S}
    # The proxy fault's payout (lab.chaos.replicas): the workload's last, started by the fault
    # itself once the rail is slowed, so that a submission is in flight when it kills a proxy;
    # started after the schedule at the latest, so every payout of the run always runs.
    held = specs[-1:] if hold_back else []
    rest = specs[1 : len(specs) - len(held)]
    started_held = asyncio.Event()

    async def start_held() -> None:
        if not started_held.is_set():
            await start_workflows(address, queue, held, **CHAOS_WORKFLOW)
            started_held.set()

    injector.replicas.held_payout = HeldPayout(held[0].payout_id, start_held) if held else None
    t0 = time.monotonic()
    await start_workflows(address, queue, specs[:1], **first)
    url = stack.database_url
    monitor = asyncio.create_task(monitor_progress(url, prefix, opts.payouts, done, progress))
    try:
        await injector.fire(schedule[0], t0, armed=armed)
        await injector.armed_frozen(schedule[0])
        await injector.start_fleet(opts.workers)
        await start_workflows(address, queue, rest, **CHAOS_WORKFLOW)
        await injector.run(schedule[1:], t0)
        if held:
            await start_held()
        progress("all faults fired; restoring normal behaviour and letting the system settle")
        await injector.restore()
        return await settle(url, prefix, opts, progress)
    finally:
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
        await injector.close()
