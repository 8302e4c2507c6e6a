"""`payouts-lab gameday`: every alert caused for real and seen firing in a real Prometheus (NFR-11).

Owns: starting the local stack and a Prometheus that scrapes every process of it, running the
scenarios of lab.gameday.scenarios in order, measuring detection latency (condition caused
-> alert firing in /api/v1/alerts) and recovery time (recovery started -> alert no longer
firing), catching any alert that fires without its condition, and appending the results table
to docs/gameday.md. Must never: count an alert as detected from anything but Prometheus's own
API, or leave a process behind (Stack and the Prometheus process stop on every exit path).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from lab.chaos.faults import FaultInjector
from lab.chaos.rail import RAIL_BASELINE
from lab.experiments.harness import isolated_ports
from lab.gameday.ctx import Ctx, Scenario
from lab.gameday.prom import GamedayPrometheus
from lab.gameday.rules import FAULT_ONLY_SERIES, alert_series, runbook_of
from lab.gameday.runbooks import unexported
from lab.gameday.scenarios import SCENARIOS
from stack.config import StackConfig
from stack.envfile import read_env_file
from stack.system import Stack

GAMEDAY_DOC = Path(__file__).resolve().parents[2] / "docs" / "gameday.md"


@dataclass(frozen=True)
class GamedayOptions:
    run_dir: Path = Path(".run/gameday")
    short: bool = True
    #: Only the scenarios whose name or alert contains one of these comma-separated words
    #: (case-insensitive); None: all of the set.
    only: str | None = None
    #: The `for:` of every alert during the game day, and Prometheus's scrape/eval interval.
    for_s: float = 3.0
    interval_s: float = 1.0
    #: How long a scenario may take to fire, and to resolve after recovery.
    fire_within_s: float = 90.0
    resolve_within_s: float = 120.0
    #: After recovery, keep watching at least this long: a consequence (e.g. the latency of
    #: payouts that completed late) must show and clear inside its own scenario.
    settle_s: float = 15.0
    doc: Path = GAMEDAY_DOC


@dataclass
class Row:
    alert: str
    scenario: str
    detection_s: float | None = None
    recovery_s: float | None = None
    confirmed: bool = False
    problems: list[str] = field(default_factory=list)
    #: Runbook blocks of the alert's section that ran (docs/runbooks/, lab.gameday.runbooks).
    blocks_run: int = 0
    #: False in the runbook check, which measures no detection latency.
    measured: bool = True

    @property
    def ok(self) -> bool:
        timed = self.detection_s is not None and self.recovery_s is not None
        return (
            (timed or not self.measured)
            and self.confirmed
            and self.blocks_run > 0
            and not self.problems
        )


def selected(short: bool, only: str | None = None) -> list[Scenario]:
    """The short or the full set; `only`: comma-separated words, the scenarios whose name or
    alert contains any of them (any case)."""
    chosen = [s for s in SCENARIOS if s.short or not short]
    if only is None:
        return chosen
    words = [w.strip().lower() for w in only.split(",") if w.strip()]
    return [
        s
        for s in chosen
        if any(w in s.name.lower() or any(w in a.lower() for a in s.alerts) for w in words)
    ]


async def run_gameday(
    options: GamedayOptions,
    progress: Callable[[str], None],
    scenarios: list[Scenario] | None = None,
    runbook_checks: Sequence[Scenario] = (),
) -> list[Row]:
    """Run `scenarios` (default: the short or the full set) on a fresh stack, then, on the same
    stack, `runbook_checks`: each cause confirmed by its scenario's own evidence and its
    runbook run as written, without waiting for Prometheus to fire and resolve the alert (no
    detection latency; the make-test check of every runbook). One row per alert."""
    scenarios = selected(options.short, options.only) if scenarios is None else scenarios
    if not scenarios and not runbook_checks:
        raise ValueError(f"no game-day scenario matches {options.only!r}")
    etcd = any(s.etcd for s in [*scenarios, *runbook_checks])
    # A fresh folder per run: an embedded etcd cluster restarted on an earlier run's data
    # (members killed by that run's scenarios) can fail to answer the lock server in time.
    run_dir = options.run_dir / datetime.now(UTC).strftime("run-%Y%m%dT%H%M%S")
    run_dir.mkdir(parents=True, mode=0o755)
    for d in (options.run_dir, run_dir):
        d.chmod(0o755)  # the embedded PostgreSQL runs unprivileged under root
    config = StackConfig.from_env(
        run_dir=run_dir / "stack",
        workers=1,
        backend="etcd" if etcd else "postgres",
        etcd_members=3 if etcd else 1,
        ports=isolated_ports(),  # never a developer's `payouts up` on the default ports
    )
    rows: list[Row] = []
    async with Stack(config, progress=progress) as stack:
        prom = GamedayPrometheus(stack, run_dir, for_s=options.for_s, interval_s=options.interval_s)
        faults = FaultInjector(stack, worker_env={}, lease_s=15.0, progress=progress)
        # The stand-ins' admin endpoints (faults, behaviour) are operator-only.
        http = httpx.AsyncClient(timeout=5.0, headers=stack.operator_headers())
        ctx = Ctx(stack, prom, faults, http)
        try:
            # Before anything runs: every runbook names only variables `payouts up` exports.
            if problems := unexported(ctx.books.values(), set(read_env_file(stack.env_file))):
                raise RuntimeError("; ".join(problems))
            await prom.start()
            progress(f"prometheus {prom.url}: ops/prometheus/prometheus.yml for this stack")
            await faults.rail(RAIL_BASELINE)
            unscraped = await _warm_up(ctx, scenarios, progress)
            for scenario in scenarios:
                rows.extend(await _run_one(ctx, scenario, options, progress, unscraped))
            for scenario in runbook_checks:
                rows.extend(
                    await _run_one(ctx, scenario, options, progress, unscraped, alerts=False)
                )
        finally:
            await ctx.aclose()
            await http.aclose()
            await faults.close()
            await prom.stop()
    return rows


async def _warm_up(
    ctx: Ctx, scenarios: list[Scenario], progress: Callable[[str], None]
) -> set[str]:
    """A few healthy payouts, so that every ratio has a denominator; then every target up and
    every series the scenarios' alerts read scraped, except those only a fault creates
    (lab.gameday.rules.FAULT_ONLY_SERIES). Returns the series still not scraped: their alerts
    fail (the shipped configuration does not scrape what they read)."""
    specs = await ctx.payouts(3)
    progress(f"warm-up: {len(specs)} payouts")
    wanted = {n for s in scenarios for a in s.alerts for n in alert_series(a)}
    wanted -= {"up", *FAULT_ONLY_SERIES}
    deadline = time.monotonic() + 60
    healthy = False
    while time.monotonic() < deadline:
        up = await ctx.prom.query("up")
        healthy = bool(up) and all(r["value"][1] == "1" for r in up)
        healthy = healthy and not await ctx.prom.firing()
        missing = wanted - await ctx.prom.present(wanted)
        if healthy and not missing:
            return set()
        await asyncio.sleep(1.0)
    if not healthy:
        raise RuntimeError(
            f"before any fault: targets down or alerts firing: {await ctx.prom.firing()}"
        )
    progress(f"warm-up: series not scraped by the shipped configuration: {sorted(missing)}")
    return missing


async def _run_one(
    ctx: Ctx,
    scenario: Scenario,
    options: GamedayOptions,
    progress: Callable[[str], None],
    unscraped: set[str],
    *,
    alerts: bool = True,
) -> list[Row]:
    rows = {a: Row(a, scenario.name, measured=alerts) for a in scenario.alerts}
    for alert, row in rows.items():
        if never := sorted(alert_series(alert) & unscraped):
            row.problems.append(f"ops/prometheus/prometheus.yml scrapes none of {never}")
    allowed = set(scenario.alerts) | set(scenario.tolerated)
    already = set(await ctx.prom.firing()) & set(scenario.alerts)
    for a in already:
        rows[a].problems.append("firing before its condition was caused")
    progress(f"scenario: {scenario.name}")
    t0 = time.monotonic()
    try:
        await scenario.cause(ctx)
        within_s = scenario.fire_within_s or options.fire_within_s
        if alerts:
            await _until_fired(ctx, rows, allowed, t0, within_s)
            await _explain_silence(ctx, rows)
            held = await scenario.confirm(ctx)
        else:
            held = await _until_confirmed(ctx, scenario, t0, within_s)
        for row in rows.values():
            row.confirmed = held
        await _runbook_phase(ctx, scenario, rows, "confirm")
    except Exception as exc:  # a scenario that broke is a failed row, and the next still runs
        for row in rows.values():
            row.problems.append(f"{type(exc).__name__}: {exc}")
    t1 = time.monotonic()
    await ctx.cancel_background()
    with contextlib.suppress(Exception):
        await scenario.recover(ctx)
    await _runbook_phase(ctx, scenario, rows, "do")  # the operator's part of the recovery
    left = await ctx.until_terminal(options.resolve_within_s)
    if left:
        progress(f"  {left} payout(s) of this scenario not terminal yet")
    ctx.created.clear()
    if alerts:
        await _until_resolved(
            ctx, rows, allowed, t1, options.resolve_within_s, settle_s=options.settle_s
        )
    await _runbook_phase(ctx, scenario, rows, "verify")
    for row in rows.values():
        progress(
            f"  {row.alert}: detected {row.detection_s}s, recovered {row.recovery_s}s,"
            f" confirmed={row.confirmed} {'; '.join(row.problems)}"
        )
    for note in ctx.notes:  # what the scenario saw (its confirm step's evidence)
        progress(f"  note: {note}")
    ctx.notes.clear()
    return list(rows.values())


async def _runbook_phase(ctx: Ctx, scenario: Scenario, rows: dict[str, Row], phase: str) -> None:
    """Each alert's runbook blocks of `phase`, run verbatim (lab.gameday.runbooks); a block
    that fails is a problem of its alert's row."""
    for alert, row in rows.items():
        for outcome in await ctx.runbook(alert, phase, scenario):
            row.blocks_run += 1
            if outcome.problem:
                row.problems.append(outcome.problem)


async def _until_confirmed(ctx: Ctx, scenario: Scenario, t0: float, within_s: float) -> bool:
    """Without Prometheus's verdict (the runbook test): until the scenario's own evidence of
    its condition holds, or `within_s` passed."""
    while time.monotonic() - t0 < within_s:
        if await scenario.confirm(ctx):
            return True
        await asyncio.sleep(1.0)
    return False


async def _explain_silence(ctx: Ctx, rows: dict[str, Row]) -> None:
    """An alert that did not fire although its cause was made: name the series it reads that
    Prometheus never got (the shipped configuration does not scrape them)."""
    for alert, row in rows.items():
        if row.detection_s is None:
            wanted = alert_series(alert) - {"up"}
            missing = wanted - await ctx.prom.present(wanted)
            if missing == wanted and wanted:
                row.problems.append(f"no sample of {sorted(missing)} was scraped")


def _spurious(firing: dict[str, Any], allowed: set[str], rows: dict[str, Row]) -> None:
    for name in set(firing) - allowed:
        for row in rows.values():
            note = f"{name} fired without its condition"
            if note not in row.problems:
                row.problems.append(note)


async def _until_fired(
    ctx: Ctx, rows: dict[str, Row], allowed: set[str], t0: float, within_s: float
) -> None:
    while time.monotonic() - t0 < within_s:
        firing = await ctx.prom.firing()
        _spurious(firing, allowed, rows)
        for name, row in rows.items():
            if name in firing and row.detection_s is None:
                row.detection_s = round(time.monotonic() - t0, 1)
        if all(r.detection_s is not None for r in rows.values()):
            return
        await asyncio.sleep(0.5)
    for row in rows.values():
        if row.detection_s is None:
            row.problems.append(f"did not fire within {within_s:.0f}s")


async def _until_resolved(
    ctx: Ctx,
    rows: dict[str, Row],
    allowed: set[str],
    t1: float,
    within_s: float,
    *,
    settle_s: float,
) -> None:
    settled_at = time.monotonic() + settle_s
    while time.monotonic() - t1 < within_s:
        firing = await ctx.prom.firing()
        _spurious(firing, allowed, rows)
        for name, row in rows.items():
            if name not in firing and row.recovery_s is None and row.detection_s is not None:
                row.recovery_s = round(time.monotonic() - t1, 1)
        done = all(r.recovery_s is not None or r.detection_s is None for r in rows.values())
        if (
            done and not set(firing) & allowed and time.monotonic() > settled_at
        ):  # consequences resolved too: a clean next one
            return
        await asyncio.sleep(0.5)
    for row in rows.values():
        if row.detection_s is not None and row.recovery_s is None:
            row.problems.append(f"still firing {within_s:.0f}s after recovery")


def table(
    rows: list[Row], *, short: bool, at: datetime | None = None, only: str | None = None
) -> str:
    when = (at or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    kind = "short, make test" if short else "full, make gameday"
    if only is not None:
        kind = f"{'short' if short else 'full'} set, only {only}"
    lines = [
        f"## Game day {when} ({kind})",
        "",
        "| alert | scenario | detection latency (s) | recovery time (s) "
        "| runbook section executed | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        result = "ok" if r.ok else "FAILED: " + "; ".join(r.problems or ["not confirmed"])
        lines.append(
            f"| [{r.alert}](runbooks/{_runbook(r.alert)}) | {r.scenario} "
            f"| {_num(r.detection_s)} | {_num(r.recovery_s)} "
            f"| {_executed(r)} "
            f"| {result} |"
        )
    return "\n".join(lines) + "\n"


def _executed(r: Row) -> str:
    if not (r.confirmed and r.blocks_run):
        return "no"
    return f"yes ({r.blocks_run} command{'' if r.blocks_run == 1 else 's'})"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _runbook(alert: str) -> str:
    return runbook_of(alert).removeprefix("docs/runbooks/")


def append_table(doc: Path, text: str) -> None:
    if not doc.exists():
        doc.write_text(
            "# Game days (NFR-11)\n\nEach run of `payouts-lab gameday` appends its table here: "
            "detection latency is condition caused -> alert firing in Prometheus's "
            "/api/v1/alerts; recovery time is recovery started -> alert no longer firing. "
            "Game-day `for:` is 3 s, scrape and evaluation every 1 s, windows and thresholds "
            "shortened (ops/prometheus/gameday-thresholds.yml, lab/gameday/prom.py).\n\n"
        )
    with doc.open("a", encoding="utf-8") as f:
        f.write("\n" + text)
