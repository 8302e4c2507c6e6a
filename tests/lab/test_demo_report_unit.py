"""Issue 28 §5, unit: the demo's report reads as words and tables (no dict repr), declines are
told apart from money that moved, and each comparison says what it compares."""

from __future__ import annotations

import re
from typing import Any

from lab.demo.report import rail_outcomes, render, table


def _report(**over: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "states": {"POSTED": 194, "FAILED": 4, "RAIL_AMBIGUOUS": 2},
        "rail": {
            "settled": 194,
            "declined": 4,
            "pending": 0,
            "no_instruction": 1,
            "more_than_one": 0,
        },
        "latency_s": {"p50": 1.2, "p99": 4.5, "exec_p50": 0.4, "exec_p99": 0.9, "n": 194},
        "reconcile": {"missing_at_rail": 0, "unrecorded_movement": 0},
        "invariants": {"INV-01": 0, "INV-02": 0},
        "invariants_not_checked": [],
        "fenced_out_in_workload": 0,
        "outbox": {
            "available": True,
            "summary": {"delivered": 640, "pending": 0, "delivery_failed": 0, "backing_off": 0},
            "postings": 245,
            "downstream_postings": 245,
            "downstream_records": 640,
        },
        "pause_experiment": {
            "t1": 3,
            "t2": 4,
            "rail_movements": 1,
            "ledger_balanced": True,
            "fenced_out_events": 1,
            "final_state": "POSTED",
            "ok": True,
            "trace": "",
        },
        "elapsed_s": 312.4,
        "checks": [{"name": "every payout terminal", "ok": True, "detail": "200 of 200"}],
        "ok": True,
    }
    report.update(over)
    return report


def _row(text: str, label: str) -> str:
    """The report's line that begins with `label` (after its indent)."""
    return next(line for line in text.splitlines() if line.strip().startswith(label))


def test_the_report_has_tables_and_words_never_a_dict_repr() -> None:
    text = render(_report())
    assert "{" not in text and "}" not in text and "':" not in text
    assert re.search(r"^\s+POSTED\s+194$", text, re.MULTILINE)
    assert re.search(r"^\s+total\s+200$", text, re.MULTILINE)
    assert "Reconciliation (payment database against the rail's log): no discrepancy" in text
    assert "Invariants INV-01..INV-10: every one holds (0 violations)" in text
    assert _row(text, "ledger balanced").endswith("yes")
    assert text.endswith("DEMO PASSED")


def test_declines_are_not_counted_as_money_that_moved() -> None:
    text = render(_report())
    assert _row(text, "settled at the rail: money moved once").endswith(" 194")
    assert _row(text, "declined by the rail: no money moved").endswith(" 4")
    assert "movements" not in _row(text, "declined")


def test_the_ledger_comparison_says_what_it_compares() -> None:
    text = render(_report())
    assert _row(text, "ledger.posted events the outbox staged").endswith(" 245")
    assert _row(text, "ledger.posted records the finance ledger booked").endswith(" 245")
    assert "postings for" not in text


def test_non_zero_counts_are_named_and_a_failed_demo_says_so() -> None:
    """Negative control: a discrepancy and a violation appear by name and number."""
    text = render(
        _report(reconcile={"missing_at_rail": 2, "other": 0}, invariants={"INV-03": 1}, ok=False)
    )
    assert "Reconciliation (payment database against the rail's log): 2 missing_at_rail" in text
    assert "Invariants INV-01..INV-10: 1 INV-03" in text
    assert text.endswith("DEMO FAILED")


def test_rail_outcomes_per_payout() -> None:
    movements = [
        {"client_reference": "p1", "status": "settled"},
        {"client_reference": "p2", "status": "declined"},
        {"client_reference": "p3", "status": "pending"},
        {"client_reference": "p4", "status": "settled"},
        {"client_reference": "p4", "status": "declined"},  # twice: counted only as a duplicate
        {"client_reference": "other", "status": "settled"},  # not one of the demo's payouts
    ]
    assert rail_outcomes(movements, ["p1", "p2", "p3", "p4", "p5"]) == {
        "settled": 1,
        "declined": 1,
        "pending": 1,
        "no_instruction": 1,
        "more_than_one": 1,
    }


def test_table_aligns_columns() -> None:
    assert table([["a", 1], ["long name", 100]]) == ["  a            1", "  long name  100"]
