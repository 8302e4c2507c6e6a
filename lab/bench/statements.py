"""PostgreSQL statements per payout (issue 29's lever), counted from the local trace files that
every process of a traced stack writes (common.tracefile), per service and in all.

A payout's statements are the asyncpg statement spans (`SpanRecord.is_statement`) in its
trace(s): each start of its workflow has a trace whose root, `payout.start`, names it (a
re-driven payout has more than one, all counted). Background polling starts no trace
(common.tracing.EntryPointSampler), so no statement outside a payout's trace is charged to it;
the service is the process that ran the statement (the workers, the lock server, the rail
proxy, the outbox publisher, ...).

Owns: the pure count (`statements_per_payout`). Must never: read the files while the stack still
runs (each process exports its spans in batches and flushes them when it stops: the caller
reads once every process is down), or count a payout whose root was not found as zero (it is
left out of the mean, and `traced_payouts` says how many were found).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from common.tracefile import PAYOUT_ROOT, SpanRecord, orphans, payout_trace_ids

#: A service's key in the figures: the workers are summed, as in the CPU per payout.
SERVICE_KEYS = {"worker": "workers"}


def service_key(span: SpanRecord) -> str:
    return SERVICE_KEYS.get(span.service, span.service)


def statements_per_payout(spans: Iterable[SpanRecord], payout_ids: Sequence[str]) -> dict[str, Any]:
    """The mean statements per payout of `payout_ids` (several bursts' payouts pooled: with the
    same N per burst, the mean of the bursts' means), per service and `total`, over the payouts
    whose trace was found (`traced_payouts` of `payouts`); `traces` counts their traces (more
    than `traced_payouts` when one was re-driven), `orphan_spans` the spans of those traces
    whose parent is missing (0 when no process lost spans)."""
    spans = list(spans)
    roots = [s for s in spans if s.name == PAYOUT_ROOT]
    owner = {t: pid for pid in payout_ids for t in payout_trace_ids(roots, pid)}
    counts: dict[str, Counter[str]] = {pid: Counter() for pid in owner.values()}
    traces: dict[str, list[SpanRecord]] = {t: [] for t in owner}
    for s in spans:
        pid = owner.get(s.trace_id)
        if pid is None:
            continue
        traces[s.trace_id].append(s)
        if s.is_statement:
            counts[pid][service_key(s)] += 1
    traced = len(counts)
    per: dict[str, float | None] = {}
    for key in sorted({k for c in counts.values() for k in c}):
        per[key] = round(sum(c[key] for c in counts.values()) / traced, 2)
    per["total"] = round(sum(c.total() for c in counts.values()) / traced, 2) if traced else None
    return {
        "statements_per_payout": per,
        "payouts": len(payout_ids),
        "traced_payouts": traced,
        "traces": len(owner),
        "orphan_spans": sum(len(orphans(t)) for t in traces.values()),
    }


def statements_line(what: str, figures: dict[str, Any]) -> str:
    """One line of bench_e2e's table: the services by count, the total, traced of payouts."""
    per = figures.get("statements_per_payout") or {}
    services = sorted(((k, v) for k, v in per.items() if k != "total"), key=lambda kv: -kv[1])
    return (
        f"{what} PostgreSQL statements per payout: total={per.get('total')} "
        + " ".join(f"{k}={v}" for k, v in services)
        + f" (traced {figures.get('traced_payouts')}/{figures.get('payouts')} payouts,"
        f" {figures.get('orphan_spans')} orphan spans)"
    )
