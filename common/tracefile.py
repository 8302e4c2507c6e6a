"""The local trace files: one JSON object per span, one line each, one file per process
(`<service>-<pid>.jsonl` in $PAYOUTS_TRACE_DIR), and reading them back as traces.

Owns: the line format (`span_line`), the exporter that writes it (`file_exporter`), and the
reader (`read_spans`, `payout_trace_ids`, `trace_of`, `orphans`) that `payouts payout trace`,
the demo and the tests share.
Must never: be the only copy of anything (a collector is the production sink; these files are
for a local stack and tests), or fail a process because a file cannot be written (the SDK's
processor logs an export error and goes on).

Why a formatter of our own on the SDK's exporter: the SDK writes spans through
`ConsoleSpanExporter(out=...)`, whose default `ReadableSpan.to_json()` spreads one span over
a dozen indented lines and repeats the whole resource in each; a line per span with what a
waterfall needs is a fifth of the size, cheaper to encode, and can be read line by line while
other processes are still appending to their own files. One file per process: no two writers
ever share a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

#: The root span of a payout's trace (common.tracing.payout_root) and the attribute naming it.
PAYOUT_ROOT = "payout.start"
PAYOUT_ID = "payout.id"
#: Set on a root whose start was refused (the workflow was running already): no trace of it.
NOT_STARTED = "payout.already_started"


def span_line(span: ReadableSpan) -> str:
    """One span as one JSON line (ids in W3C hex, times in Unix nanoseconds)."""
    ctx = span.get_span_context()
    parent = span.parent
    record = {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
        "span_id": f"{ctx.span_id:016x}" if ctx else None,
        "parent_id": f"{parent.span_id:016x}" if parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "service": span.resource.attributes.get("service.name"),
        "instance": span.resource.attributes.get("service.instance.id"),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
    }
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"


def file_exporter(folder: Path, service: str) -> ConsoleSpanExporter:
    """The SDK's stream exporter writing `span_line`s to `<folder>/<service>-<pid>.jsonl`."""
    folder.mkdir(parents=True, exist_ok=True)
    stream = (folder / f"{service}-{os.getpid()}.jsonl").open("a", encoding="utf-8")
    return ConsoleSpanExporter(service_name=service, out=stream, formatter=span_line)


@dataclass(frozen=True)
class SpanRecord:
    """One span as read back from a trace file."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    service: str
    instance: str | None
    start_ns: int
    end_ns: int
    status: str
    attributes: dict[str, Any] = field(default_factory=dict)
    links: list[dict[str, str]] = field(default_factory=list)

    @property
    def process(self) -> str:
        """The process that recorded it: its instance (a worker's id, else `service-pid`)."""
        return self.instance or self.service

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def is_statement(self) -> bool:
        """A database statement (the asyncpg instrumentation's span)."""
        return "db.system" in self.attributes or "db.system.name" in self.attributes


def _record(raw: dict[str, Any]) -> SpanRecord | None:
    try:
        return SpanRecord(
            trace_id=str(raw["trace_id"]),
            span_id=str(raw["span_id"]),
            parent_id=raw.get("parent_id"),
            name=str(raw["name"]),
            kind=str(raw.get("kind", "")),
            service=str(raw.get("service") or "?"),
            instance=raw.get("instance"),
            start_ns=int(raw["start_ns"]),
            end_ns=int(raw["end_ns"]),
            status=str(raw.get("status", "")),
            attributes=dict(raw.get("attributes") or {}),
            links=list(raw.get("links") or []),
        )
    except (KeyError, TypeError, ValueError):
        return None


def read_spans(folder: Path) -> list[SpanRecord]:
    """Every span in the `*.jsonl` files under `folder` (recursively). A line a process is still
    writing (or one cut short by a kill) is skipped, never an error."""
    spans = []
    for path in sorted(folder.rglob("*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    raw = json.loads(line)
                except ValueError:
                    continue
                record = _record(raw) if isinstance(raw, dict) else None
                if record is not None:
                    spans.append(record)
    return spans


def payout_trace_ids(spans: Iterable[SpanRecord], payout_id: str) -> list[str]:
    """The traces of `payout_id`, oldest first: one per start of its workflow (a re-driven payout
    has one more)."""
    roots = [
        s
        for s in spans
        if s.name == PAYOUT_ROOT
        and s.parent_id is None
        and s.attributes.get(PAYOUT_ID) == payout_id
        and not s.attributes.get(NOT_STARTED)
    ]
    return [s.trace_id for s in sorted(roots, key=lambda s: s.start_ns)]


def trace_of(spans: Iterable[SpanRecord], trace_id: str) -> list[SpanRecord]:
    """The spans of one trace, by start time."""
    return sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)


def orphans(trace: list[SpanRecord]) -> list[SpanRecord]:
    """Spans whose parent is not in `trace`: none in a whole trace, whatever process wrote
    each span."""
    ids = {s.span_id for s in trace}
    return [s for s in trace if s.parent_id is not None and s.parent_id not in ids]
