"""lab.bench.handoff: the hot account's hand-off split into its segments, from synthetic spans of
known times (ms), pairs taken in the order the payouts reached the rail; a payout without its
landmarks breaks no pair into a false figure: it is left out."""

from __future__ import annotations

import itertools
from typing import Any

from common.tracefile import PAYOUT_ID, PAYOUT_ROOT, SpanRecord
from lab.bench.handoff import SEGMENTS, anatomy_line, handoff_anatomy

_ids = itertools.count(1)
_MS = 1_000_000
_LOCKS = "https://127.0.0.1:1/v1/locks"


def _span(
    trace: str, service: str, kind: str, name: str, start: float, end: float, url: str = ""
) -> SpanRecord:
    attributes: dict[str, Any] = {"http.url": url} if url else {}
    return SpanRecord(
        trace_id=trace,
        span_id=f"{next(_ids):016x}",
        parent_id=f"r{trace}",
        name=name,
        kind=kind,
        service=service,
        instance=None,
        start_ns=int(start * _MS),
        end_ns=int(end * _MS),
        status="UNSET",
        attributes=attributes,
    )


def _payout(payout: str, t0: float, *, release: bool = True) -> list[SpanRecord]:
    """One payout's happy path from `t0`: waits 50 ms for the grant (two acquire answers, the
    second the grant), claims for 6, reaches the proxy 4 later, records for 5, reaches the rail
    3 later; the rail answers after 300; 1 + 2 + 0.5 back to the worker; ack-and-post 7."""
    trace = f"t-{payout}"
    root = SpanRecord(
        trace_id=trace,
        span_id=f"r{trace}",
        parent_id=None,
        name=PAYOUT_ROOT,
        kind="INTERNAL",
        service="bench-e2e",
        instance=None,
        start_ns=int(t0 * _MS),
        end_ns=int(t0 * _MS) + 1,
        status="UNSET",
        attributes={PAYOUT_ID: payout},
    )
    grant = t0 + 50
    submit = grant + 6
    proxy = submit + 4
    forward = proxy + 5
    rail = forward + 3
    answered = rail + 300
    spans = [
        root,
        _span(trace, "worker", "CLIENT", "POST", t0, t0 + 20, f"{_LOCKS}/acquire"),
        _span(trace, "worker", "CLIENT", "POST", t0 + 20, grant, f"{_LOCKS}/acquire"),
        _span(
            trace, "worker", "CLIENT", "POST", submit, answered + 3.5, "https://p/v1/submissions"
        ),
        _span(trace, "railproxy", "SERVER", "POST /v1/submissions", proxy, answered + 3),
        _span(trace, "railproxy", "CLIENT", "POST", forward, answered + 1),
        _span(trace, "railstub", "SERVER", "POST /payments", rail, answered),
    ]
    if release:
        spans.append(
            _span(
                trace,
                "worker",
                "CLIENT",
                "POST",
                answered + 10.5,
                answered + 12,
                f"{_LOCKS}/release",
            )
        )
    return spans


def test_each_segment_is_read_between_consecutive_payouts_at_the_rail() -> None:
    # po-b reaches the rail first although listed second: pairs follow the rail's order.
    # po-b's rail answer at 50+18+300 = 368; po-a's grant 8 ms after po-b's release starts.
    b = _payout("po-b", 0)
    a = _payout("po-a", 368 + 10.5 + 8 - 50)
    figures = handoff_anatomy([*a, *b], ["po-a", "po-b"])
    assert figures["handoff_anatomy_pairs"] == 1
    assert figures["handoff_anatomy_p50_ms"] == {
        "rail_to_proxy": 1.0,
        "proxy_outcome": 2.0,
        "answer_to_worker": 0.5,
        "ack_and_post": 7.0,
        "release_to_grant": 8.0,
        "claim": 6.0,
        "submit_to_proxy": 4.0,
        "proxy_record": 5.0,
        "forward_to_rail": 3.0,
        "total": 36.5,
    }
    line = anatomy_line(figures)
    assert "release_to_grant=8.0" in line and "total=36.5 (1 pairs)" in line


def test_a_payout_without_its_landmarks_is_left_out() -> None:
    first = _payout("po-1", 0, release=False)  # went another way: no release of its own
    second = _payout("po-2", 400)
    third = _payout("po-3", 800)
    figures = handoff_anatomy([*first, *second, *third], ["po-1", "po-2", "po-3"])
    assert figures["handoff_anatomy_pairs"] == 1  # po-2 -> po-3 only
    # Not the spans of another account's payouts either.
    assert handoff_anatomy([*second, *third], ["po-9"])["handoff_anatomy_pairs"] == 0
    empty = handoff_anatomy([], ["po-1"])
    assert empty["handoff_anatomy_p50_ms"] == dict.fromkeys(SEGMENTS)
