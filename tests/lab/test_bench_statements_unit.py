"""lab.bench.statements: a payout's PostgreSQL statements are the statement spans of its own
trace(s), per service; nothing of another payout's trace or of a trace without a payout."""

from __future__ import annotations

import itertools
from typing import Any

from common.tracefile import NOT_STARTED, PAYOUT_ID, PAYOUT_ROOT, SpanRecord
from lab.bench.statements import statements_line, statements_per_payout

_ids = itertools.count(1)


def _span(
    trace: str,
    name: str,
    service: str,
    parent: str | None,
    *,
    attributes: dict[str, Any] | None = None,
    span_id: str | None = None,
    start: int = 0,
) -> SpanRecord:
    return SpanRecord(
        trace_id=trace,
        span_id=span_id or f"{next(_ids):016x}",
        parent_id=parent,
        name=name,
        kind="INTERNAL",
        service=service,
        instance=None,
        start_ns=start,
        end_ns=start + 1,
        status="UNSET",
        attributes=attributes or {},
    )


def _root(trace: str, payout: str, start: int = 0, **extra: Any) -> SpanRecord:
    attributes = {PAYOUT_ID: payout, **extra}
    return _span(trace, PAYOUT_ROOT, "bench-e2e", None, attributes=attributes, span_id=f"r{trace}")


def _statements(trace: str, service: str, n: int) -> list[SpanRecord]:
    return [
        _span(trace, "SELECT", service, f"r{trace}", attributes={"db.system": "postgresql"})
        for _ in range(n)
    ]


def _work(trace: str, service: str) -> SpanRecord:
    """A span that is not a statement (an activity, a request)."""
    return _span(trace, "RunActivity:x", service, f"r{trace}")


def test_each_payout_counts_only_the_statements_of_its_own_traces() -> None:
    spans = [
        # po-a: started twice (re-driven): both traces count.
        _root("ta1", "po-a", start=1),
        *_statements("ta1", "worker", 10),
        *_statements("ta1", "lock-server", 4),
        _work("ta1", "worker"),
        _root("ta2", "po-a", start=2),
        *_statements("ta2", "worker", 2),
        # po-b: one trace, with the rail proxy and the outbox too.
        _root("tb", "po-b"),
        *_statements("tb", "worker", 6),
        *_statements("tb", "lock-server", 2),
        *_statements("tb", "railproxy", 3),
        *_statements("tb", "outbox", 1),
        # Not asked for: another payout's trace must not be charged to po-a or po-b.
        _root("tc", "po-c"),
        *_statements("tc", "worker", 100),
        # A trace without a payout (an operator's request) and a refused start's root.
        _span("tx", "GET /admin", "railproxy", None, span_id="rtx"),
        *_statements("tx", "railproxy", 50),
        _root("tr", "po-a", start=3, **{NOT_STARTED: True}),
        *_statements("tr", "worker", 70),
    ]
    out = statements_per_payout(spans, ["po-a", "po-b"])
    # po-a: worker 12, lock-server 4; po-b: worker 6, lock-server 2, railproxy 3, outbox 1.
    assert out["statements_per_payout"] == {
        "lock-server": 3.0,
        "outbox": 0.5,
        "railproxy": 1.5,
        "workers": 9.0,
        "total": 14.0,
    }
    assert (out["payouts"], out["traced_payouts"], out["traces"]) == (2, 2, 3)
    assert out["orphan_spans"] == 0


def test_a_payout_without_a_trace_is_left_out_of_the_mean_not_counted_as_zero() -> None:
    spans = [_root("ta", "po-a"), *_statements("ta", "worker", 8)]
    out = statements_per_payout(spans, ["po-a", "po-lost"])
    assert out["statements_per_payout"] == {"workers": 8.0, "total": 8.0}
    assert (out["payouts"], out["traced_payouts"]) == (2, 1)


def test_a_span_whose_parent_is_missing_is_reported() -> None:
    lost = _span("ta", "SELECT", "worker", "gone", attributes={"db.system.name": "postgresql"})
    out = statements_per_payout([_root("ta", "po-a"), lost], ["po-a"])
    assert out["statements_per_payout"] == {"workers": 1.0, "total": 1.0}
    assert out["orphan_spans"] == 1


def test_no_trace_found_gives_no_figure() -> None:
    out = statements_per_payout(_statements("tx", "worker", 3), ["po-a"])
    assert out["statements_per_payout"] == {"total": None}
    assert out["traced_payouts"] == 0


def test_the_table_line_lists_the_services_by_count() -> None:
    spans = [
        _root("ta", "po-a"),
        *_statements("ta", "worker", 5),
        *_statements("ta", "railproxy", 2),
    ]
    line = statements_line("system burst", statements_per_payout(spans, ["po-a", "po-b"]))
    assert line == (
        "system burst PostgreSQL statements per payout: total=7.0 workers=5.0 railproxy=2.0"
        " (traced 1/2 payouts, 0 orphan spans)"
    )
