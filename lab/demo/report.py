"""The demo's report as a person reads it: figures in words and tables, never a dict's repr.

Owns: rendering the report `lab.demo.run` assembles (plain figures) as text, and summarising the
rail's movement log per payout: settled (money moved), declined (the rail refused, no money
moved), still pending, never instructed, instructed more than once. Must never: read anything
or decide a check's verdict (lab.demo.run does both); it is pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

RULE = "=" * 72

#: The rail outcomes of a payout, in the order and the words of the report.
RAIL_OUTCOMES = (
    ("settled", "settled at the rail: money moved once"),
    ("declined", "declined by the rail: no money moved"),
    ("pending", "still pending at the rail"),
    ("no_instruction", "never instructed"),
    ("more_than_one", "instructed more than once"),
)


def rail_outcomes(movements: Iterable[Mapping[str, Any]], ids: Sequence[str]) -> dict[str, int]:
    """Payouts by what the rail's movement log holds for them (`client_reference` is the payout
    id). A payout with more than one instruction is counted there alone, whatever each says."""
    statuses: dict[str, list[str]] = defaultdict(list)
    for m in movements:
        statuses[str(m["client_reference"])].append(str(m["status"]))
    out = dict.fromkeys((key for key, _ in RAIL_OUTCOMES), 0)
    for payout_id in ids:
        seen = statuses.get(payout_id, [])
        if not seen:
            out["no_instruction"] += 1
        elif len(seen) > 1:
            out["more_than_one"] += 1
        else:
            out[seen[0]] += 1
    return out


def table(rows: Sequence[Sequence[object]], indent: str = "  ") -> list[str]:
    """Rows as aligned columns: the first left-aligned, the others right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for row in cells:
        rest = zip(row[1:], widths[1:], strict=True)
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in rest]
        lines.append(indent + "  ".join(parts).rstrip())
    return lines


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def counts_in_words(counts: Mapping[str, int], none: str) -> str:
    """`3 missing_at_rail, 1 stale_claim` (only what is non-zero), or `none` when all are 0."""
    found = [f"{n} {name}" for name, n in sorted(counts.items()) if n]
    return ", ".join(found) if found else none


def _states(report: Mapping[str, Any]) -> list[str]:
    states: Mapping[str, int] = report["states"]
    rows: list[list[object]] = [["state", "payouts"]]
    rows += [[s, n] for s, n in sorted(states.items(), key=lambda kv: (-kv[1], kv[0]))]
    rows.append(["total", sum(states.values())])
    return ["Payouts by state (the payment database)", *table(rows)]


def _rail(report: Mapping[str, Any]) -> list[str]:
    rail: Mapping[str, int] = report["rail"]
    rows = [[words, rail.get(key, 0)] for key, words in RAIL_OUTCOMES]
    return ["Payouts by what the rail recorded (its movement log)", *table(rows)]


def _latency(report: Mapping[str, Any]) -> list[str]:
    lat = report["latency_s"]
    rows: list[list[object]] = [
        ["seconds, POSTED payouts only", "p50", "p99", "payouts"],
        ["end to end: created -> POSTED", lat["p50"], lat["p99"], lat["n"]],
        ["execution: claimed -> POSTED (NFR-04)", lat["exec_p50"], lat["exec_p99"], lat["n"]],
    ]
    note = "  (end to end includes waiting behind the account's earlier payouts: one at a time)"
    return ["Latency (the payment database's clock)", *table(rows), note]


def _checks_of_record(report: Mapping[str, Any]) -> list[str]:
    lines = [
        "Reconciliation (payment database against the rail's log): "
        + counts_in_words(report["reconcile"], "no discrepancy"),
        "Invariants INV-01..INV-10: "
        + counts_in_words(report["invariants"], "every one holds (0 violations)"),
    ]
    lines += [f"  not checked: {rule}" for rule in report.get("invariants_not_checked", [])]
    lines.append(f"Fenced-out writes in the normal workload: {report['fenced_out_in_workload']}")
    return lines


def _outbox(report: Mapping[str, Any]) -> list[str]:
    ob = report["outbox"]
    if not ob.get("available"):
        return ["Outbox: not part of this stack"]
    s = ob["summary"]
    rows: list[list[object]] = [
        ["outbox rows delivered", s.get("delivered", 0)],
        ["outbox rows pending (backing off)", f"{s.get('pending', 0)} ({s.get('backing_off', 0)})"],
        ["outbox rows dead-lettered", s.get("delivery_failed", 0)],
        ["ledger.posted events the outbox staged", ob["postings"]],
        ["ledger.posted records the finance ledger booked", ob["downstream_postings"]],
        ["records the finance ledger holds, all types", ob["downstream_records"]],
    ]
    return ["Outbox (payment database -> finance ledger)", *table(rows)]


def _pause(report: Mapping[str, Any]) -> list[str]:
    p = report.get("pause_experiment")
    if p is None:
        return []
    rows: list[list[object]] = [
        ["fencing token of the paused (stale) holder, T1", p["t1"]],
        ["fencing token of the holder that took over, T2", p["t2"]],
        ["rail movements for the payout", p["rail_movements"]],
        ["fenced-out events", p["fenced_out_events"]],
        ["ledger balanced", bool(p["ledger_balanced"])],
        ["payout's final state", p["final_state"]],
        ["stale holder fenced out", bool(p["ok"])],
    ]
    return ["Pause experiment (UC-03, fencing on, its own stack)", *table(rows)]


def render(report: Mapping[str, Any]) -> str:
    """The whole report: sections of tables and sentences, the checks, then the verdict."""
    sections = [
        _states(report),
        _rail(report),
        _latency(report),
        _checks_of_record(report),
        _outbox(report),
        _pause(report),
    ]
    lines = ["", RULE, "PAYOUT DEMO REPORT", RULE]
    for section in sections:
        if section:
            lines += [*section, ""]
    lines.append(f"Elapsed: {report['elapsed_s']} s")
    lines.append("-" * 72)
    for c in report["checks"]:
        lines.append(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
    lines.append(RULE)
    trace = (report.get("pause_experiment") or {}).get("trace")
    if trace:
        lines.append(
            "the pause experiment's payout, its trace (payouts payout trace; docs/tracing.md):"
        )
        lines.append(trace)
        lines.append(RULE)
    lines.append("DEMO PASSED" if report["ok"] else "DEMO FAILED")
    return "\n".join(lines)
