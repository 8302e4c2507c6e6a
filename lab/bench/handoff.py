"""Where the hot account's hand-off goes (issue 29), read from the trace files of a traced stack
(common.tracefile): between one payout's answer at the rail and the next payout's instruction
arriving there, the median of each segment of the chain that serialises the account (A-15).

The landmarks are the spans every payout's trace has on the happy path, in this order: the rail
stub's server span (`POST /payments`), the proxy's client span to the rail and its server span
(`POST /v1/submissions`), the worker's client spans to the proxy and to the lock server
(`/v1/locks/acquire`, `/v1/locks/release`). For consecutive payouts i and i+1 (in their order
at the rail):

| segment | from | to |
|---|---|---|
| `rail_to_proxy` | i's answer leaves the stub | the proxy has it |
| `proxy_outcome` | the proxy has it | the proxy's answer leaves (the outcome's write) |
| `answer_to_worker` | the proxy's answer leaves | the worker has it |
| `ack_and_post` | the worker has it | its release starts (the ack-and-post transaction) |
| `release_to_grant` | the release starts | i+1's acquire returns with the grant |
| `claim` | the grant arrived | i+1's submit starts (the claim's transaction) |
| `submit_to_proxy` | the submit starts | the proxy's server span starts (connect, TLS, request) |
| `proxy_record` | the proxy's server span starts | its forward starts (gates, the record) |
| `forward_to_rail` | the forward starts | the stub's server span starts (connect, TLS, request) |
| `total` | i's answer leaves the stub | i+1's instruction arrives there |

Each segment's median is taken on its own, so the medians need not add up to the median total.
`rail_to_proxy` and `answer_to_worker` end a server's span against its client's in another
process; a server closes its span once its answer has left, sometimes after the client has
read it, so these two can be slightly negative. Every other segment is bounded by two spans of
one process, or by a request's start and its arrival, and never is.
A pair with a landmark missing (a payout that went another way, a span lost) is left out, and
`pairs` says how many counted.

Owns: the pure reading of landmarks (`handoff_anatomy`). Must never: read the files while the
stack still runs (lab.bench.statements says why), or compare spans of different machines' clocks
(a local stack's processes share one).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from common.tracefile import PAYOUT_ROOT, SpanRecord, payout_trace_ids

SEGMENTS = (
    "rail_to_proxy",
    "proxy_outcome",
    "answer_to_worker",
    "ack_and_post",
    "release_to_grant",
    "claim",
    "submit_to_proxy",
    "proxy_record",
    "forward_to_rail",
    "total",
)


@dataclass(frozen=True)
class _Landmarks:
    """One payout's happy-path spans (the acquire: the one that returned the grant used)."""

    acquire: SpanRecord
    submit: SpanRecord  # the worker's client span to the proxy
    proxy: SpanRecord  # the proxy's server span
    forward: SpanRecord  # the proxy's client span to the rail
    rail: SpanRecord  # the stub's server span
    release: SpanRecord


def _url_ends(path: str) -> Callable[[SpanRecord], bool]:
    return lambda s: str(s.attributes.get("http.url", "")).endswith(path)


def _one(spans: list[SpanRecord], test: Callable[[SpanRecord], bool]) -> SpanRecord | None:
    found = [s for s in spans if test(s)]
    return found[0] if len(found) == 1 else None


def _landmarks(spans: list[SpanRecord]) -> _Landmarks | None:
    """The landmarks of one payout's spans, or None unless it went the happy path once."""
    worker = [s for s in spans if s.kind == "CLIENT" and s.service == "worker"]
    submit = _one(worker, _url_ends("/v1/submissions"))
    proxy = _one(spans, lambda s: s.kind == "SERVER" and s.name == "POST /v1/submissions")
    forward = _one(
        spans, lambda s: s.kind == "CLIENT" and s.service == "railproxy" and s.name == "POST"
    )
    rail = _one(spans, lambda s: s.kind == "SERVER" and s.name == "POST /payments")
    release = _one(worker, _url_ends("/v1/locks/release"))
    if not (submit and proxy and forward and rail and release):
        return None
    # A waiter may ask more than once; the grant it used came with the last answer before the
    # submit.
    acquires = [
        s for s in worker if _url_ends("/v1/locks/acquire")(s) and s.end_ns <= submit.start_ns
    ]
    if not acquires:
        return None
    acquire = max(acquires, key=lambda s: s.end_ns)
    return _Landmarks(acquire, submit, proxy, forward, rail, release)


def _segments(a: _Landmarks, b: _Landmarks) -> dict[str, float]:
    marks = {
        "rail_to_proxy": (a.rail.end_ns, a.forward.end_ns),
        "proxy_outcome": (a.forward.end_ns, a.proxy.end_ns),
        "answer_to_worker": (a.proxy.end_ns, a.submit.end_ns),
        "ack_and_post": (a.submit.end_ns, a.release.start_ns),
        "release_to_grant": (a.release.start_ns, b.acquire.end_ns),
        "claim": (b.acquire.end_ns, b.submit.start_ns),
        "submit_to_proxy": (b.submit.start_ns, b.proxy.start_ns),
        "proxy_record": (b.proxy.start_ns, b.forward.start_ns),
        "forward_to_rail": (b.forward.start_ns, b.rail.start_ns),
        "total": (a.rail.end_ns, b.rail.start_ns),
    }
    return {name: (end - start) / 1e6 for name, (start, end) in marks.items()}


def handoff_anatomy(spans: Iterable[SpanRecord], payout_ids: Sequence[str]) -> dict[str, Any]:
    """The median ms of each segment (`SEGMENTS`) over the consecutive pairs of `payout_ids`
    (one account's payouts) at the rail, and how many pairs counted."""
    spans = list(spans)
    roots = [s for s in spans if s.name == PAYOUT_ROOT]
    owner = {t: pid for pid in payout_ids for t in payout_trace_ids(roots, pid)}
    by_payout: dict[str, list[SpanRecord]] = {pid: [] for pid in payout_ids}
    for s in spans:
        pid = owner.get(s.trace_id)
        if pid is not None:
            by_payout[pid].append(s)
    found = [m for m in map(_landmarks, by_payout.values()) if m is not None]
    found.sort(key=lambda m: m.rail.start_ns)
    pairs = [_segments(a, b) for a, b in itertools.pairwise(found)]
    medians = {
        name: round(statistics.median(p[name] for p in pairs), 2) if pairs else None
        for name in SEGMENTS
    }
    return {"handoff_anatomy_p50_ms": medians, "handoff_anatomy_pairs": len(pairs)}


def anatomy_line(figures: dict[str, Any]) -> str:
    """One line of bench_e2e's table: the segments in chain order, then the total."""
    medians = figures.get("handoff_anatomy_p50_ms") or {}
    parts = " ".join(f"{name}={medians.get(name)}" for name in SEGMENTS[:-1])
    return (
        f"hot account hand-off p50 by segment, ms: {parts}; total={medians.get('total')}"
        f" ({figures.get('handoff_anatomy_pairs')} pairs)"
    )
