"""What a game-day scenario is and what it works with: `Scenario` (cause, confirm, recover, the
alerts it must raise) and `Ctx` (the stack, its Prometheus, a fault injector, one HTTP client, and
helpers to run operator commands and create payouts through the system's own entry points).

Owns: those two types; the scenarios themselves are lab.gameday.scenarios'. Must never: resubmit
a payout or touch a payout's state by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from lab.chaos.faults import FaultInjector
from lab.gameday.prom import GamedayPrometheus
from lab.gameday.runbooks import Outcome, Runbook, block_env, run_block, runbooks, section_of
from lab.gameday.scratch import ScratchReconciler
from ledger.states import TERMINAL_STATES
from payouts.batch import PayoutSpec
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.envfile import read_env_file
from stack.system import Stack


@dataclass
class Ctx:
    """What a scenario works with: the stack, its Prometheus, a fault injector, one client."""

    stack: Stack
    prom: GamedayPrometheus
    faults: FaultInjector
    http: httpx.AsyncClient
    notes: list[str] = field(default_factory=list)
    seq: int = 0
    #: Payout ids this scenario created: recovery waits for them (late completions of a fault's
    #: payouts belong to that fault, not to the next scenario).
    created: list[str] = field(default_factory=list)
    #: Load a scenario keeps up in the background while detection is measured (cancelled by
    #: the runner after recovery), so that the cause step returns at once.
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: The scratch reconciliation world, once a scenario made one (closed by `aclose`).
    scratch: ScratchReconciler | None = None
    #: docs/runbooks/*.md, parsed (each scenario runs its alerts' sections).
    books: dict[str, Runbook] = field(default_factory=runbooks)

    async def aclose(self) -> None:
        """The game day's end: drop the scratch database, stop its exporter."""
        if self.scratch is not None:
            await self.scratch.close()
            self.scratch = None

    def background(self, coro: Awaitable[None]) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    async def cancel_background(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()

    def env(self) -> dict[str, str]:
        """The addresses the operator commands read: exactly what `payouts up` writes to the
        stack's environment file (over any of the caller's own, which may name another stack)."""
        return {**os.environ, **read_env_file(self.stack.env_file)}

    async def runbook(self, alert: str, phase: str, scenario: Scenario) -> list[Outcome]:
        """The alert's runbook blocks of `phase`, each run verbatim against this stack."""
        book, _ = section_of(alert, self.books)
        overrides = scenario.runbook_env(self) if scenario.runbook_env else {}
        env = block_env(self.stack.env_file, overrides)
        outcomes = []
        for block in book.section(alert, phase):
            outcome = await run_block(book, block, env)
            outcomes.append(outcome)
            self.notes.append(f"runbook {block.where}: exit {outcome.rc}")
        return outcomes

    async def command(
        self, *argv: str, timeout_s: float = 60.0, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Run one operator command (`payouts ...`, `python -m lockservice ...`); (rc, output)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            env={**self.env(), **(env or {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -9, "timed out"
        return proc.returncode or 0, out.decode(errors="replace")

    async def payouts(
        self, n: int, amount: int = 100, workflow: dict[str, Any] | None = None
    ) -> list[PayoutSpec]:
        """n fresh payouts on a fresh funded account, their workflows started (`workflow`:
        PayoutInput overrides, e.g. the pause experiment's short timeouts)."""
        self.seq += 1
        prefix = f"gd{self.seq}-{uuid.uuid4().hex[:6]}-"
        accounts = await seed_accounts(self.stack.database_url, 1, 10_000_000, prefix)
        specs = [PayoutSpec(f"{prefix}p{i}", accounts[0], amount) for i in range(n)]
        await create_payouts(self.stack.database_url, specs)
        await start_workflows(
            self.stack.temporal_address, self.stack.config.task_queue, specs, **(workflow or {})
        )
        self.created.extend(s.payout_id for s in specs)
        return specs

    async def until_terminal(self, within_s: float) -> int:
        """Wait until every payout this scenario created is terminal; returns how many are not."""
        deadline = asyncio.get_running_loop().time() + within_s
        conn = await asyncpg.connect(self.stack.database_url)
        try:
            while True:
                open_ = await conn.fetchval(
                    "SELECT count(*) FROM paydb.payouts"
                    " WHERE payout_id = ANY($1::text[]) AND NOT state = ANY($2::text[])",
                    self.created,
                    [str(s) for s in TERMINAL_STATES],
                )
                if not open_ or asyncio.get_running_loop().time() > deadline:
                    return int(open_)
                await asyncio.sleep(0.5)
        finally:
            await conn.close()


Step = Callable[[Ctx], Awaitable[None]]
Confirm = Callable[[Ctx], Awaitable[bool]]


@dataclass(frozen=True)
class Scenario:
    name: str
    #: Alerts that must fire (each its own table row).
    alerts: tuple[str, ...]
    cause: Step
    confirm: Confirm
    recover: Step
    #: Alerts this condition may also raise (a consequence, not a false alarm).
    tolerated: tuple[str, ...] = ()
    #: Needs the etcd backend with three members.
    etcd: bool = False
    #: Part of the short game day that `make test` runs.
    short: bool = False
    #: Longer than the game day's default fire budget (a cause that must wait out a lease).
    fire_within_s: float | None = None
    #: What its runbook blocks see in place of the environment file's values (a scenario's own
    #: world): `PAYOUTS_RUNBOOK_<NAME>` values (lab.gameday.runbooks.OVERRIDE_PREFIX).
    runbook_env: Callable[[Ctx], dict[str, str]] | None = None
