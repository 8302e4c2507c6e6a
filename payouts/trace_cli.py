"""`payouts payout trace ID`: one payout's trace as a waterfall in the terminal, read from the
local trace files (common.tracefile; docs/tracing.md says how to read it).

Owns: the waterfall (`waterfall`, which the demo prints too) and the command. Must never: write
anything, or hide a span: a run of consecutive statements is folded into one line (unless
`--sql`), and the line says how many it holds.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.tracefile import SpanRecord, orphans, payout_trace_ids, read_spans, trace_of
from payouts.errors import EXIT_NOT_FOUND, CommandError, guard, payout_id_arg

BAR_WIDTH = 40


@dataclass(frozen=True)
class _Row:
    depth: int
    name: str
    process: str
    start_ns: int
    end_ns: int
    error: bool


def _children(trace: list[SpanRecord]) -> dict[str | None, list[SpanRecord]]:
    ids = {s.span_id for s in trace}
    out: dict[str | None, list[SpanRecord]] = defaultdict(list)
    for s in trace:
        # An orphan (its parent's process has not flushed yet, or was killed) is drawn at the top.
        out[s.parent_id if s.parent_id in ids else None].append(s)
    return out


def _fold(statements: list[SpanRecord], depth: int) -> _Row:
    """A run of sibling statements as one row: how many, and their time in all."""
    total = sum(k.duration_ms for k in statements)
    return _Row(
        depth,
        f"{len(statements)} SQL statements ({total:.1f} ms)",
        statements[0].process,
        min(k.start_ns for k in statements),
        max(k.end_ns for k in statements),
        any(k.status == "ERROR" for k in statements),
    )


def _rows(trace: list[SpanRecord], *, sql: bool) -> Iterator[_Row]:
    """Depth-first, children by start time; each run of a parent's consecutive statements
    folded into one row unless `sql`."""
    children = _children(trace)

    def flush(run: list[SpanRecord], depth: int) -> Iterator[_Row]:
        if len(run) == 1:
            yield from walk(run[0], depth)
        elif run:
            yield _fold(run, depth)

    def walk(span: SpanRecord, depth: int) -> Iterator[_Row]:
        yield _Row(
            depth, span.name, span.process, span.start_ns, span.end_ns, span.status == "ERROR"
        )
        run: list[SpanRecord] = []
        for kid in sorted(children.get(span.span_id, []), key=lambda s: s.start_ns):
            if not sql and kid.is_statement and not children.get(kid.span_id):
                run.append(kid)
                continue
            yield from flush(run, depth + 1)
            run = []
            yield from walk(kid, depth + 1)
        yield from flush(run, depth + 1)

    for root in sorted(children.get(None, []), key=lambda s: s.start_ns):
        yield from walk(root, 0)


def waterfall(trace: list[SpanRecord], *, sql: bool = False, width: int = BAR_WIDTH) -> str:
    """The trace as text: per span its start and duration (ms from the trace's first span), a
    bar on the trace's time line, its name indented by depth, and the process that recorded it."""
    if not trace:
        return "(no spans)"
    t0 = min(s.start_ns for s in trace)
    t1 = max(s.end_ns for s in trace)
    scale = width / max(1, t1 - t0)
    processes = sorted({s.process for s in trace})
    head = (
        f"trace {trace[0].trace_id}: {len(trace)} spans, {(t1 - t0) / 1e6:.1f} ms, "
        f"{len(processes)} processes ({', '.join(processes)})"
    )
    lines = [head, f"{'start ms':>10} {'dur ms':>9}  {'|' + '-' * width + '|'}  span [process]"]
    for r in _rows(trace, sql=sql):
        left = int((r.start_ns - t0) * scale)
        length = max(1, int((r.end_ns - r.start_ns) * scale))
        bar = (" " * left + "#" * length)[:width].ljust(width)
        mark = " !" if r.error else ""
        lines.append(
            f"{(r.start_ns - t0) / 1e6:>10.1f} {(r.end_ns - r.start_ns) / 1e6:>9.1f}  |{bar}|  "
            f"{'  ' * r.depth}{r.name} [{r.process}]{mark}"
        )
    lost = orphans(trace)
    if lost:
        lines.append(f"{len(lost)} span(s) whose parent is not in the files (drawn at the top)")
    return "\n".join(lines)


def payout_waterfalls(folder: Path, payout_id: str, *, sql: bool = False) -> list[str]:
    """A waterfall per trace of `payout_id` (one per start of its workflow), oldest first."""
    spans = read_spans(folder)
    return [waterfall(trace_of(spans, t), sql=sql) for t in payout_trace_ids(spans, payout_id)]


def _cmd_trace(args: argparse.Namespace) -> int:
    folder = args.trace_dir or os.environ.get("PAYOUTS_TRACE_DIR")
    if not folder:
        raise CommandError(
            "no trace folder: pass --trace-dir or set $PAYOUTS_TRACE_DIR (`payouts up` prints "
            "it); with a collector configured, search its UI for the tag payout.id="
            f"{args.payout_id} instead"
        )
    path = Path(folder)
    if not path.is_dir():
        raise CommandError(f"trace folder {path} does not exist")
    drawn = payout_waterfalls(path, args.payout_id, sql=args.sql)
    if not drawn and args.payout_id.startswith("payout-"):  # as `payout list` prints it
        drawn = payout_waterfalls(path, args.payout_id.removeprefix("payout-"), sql=args.sql)
    if not drawn:
        raise CommandError(
            f"no trace of payout {args.payout_id} under {path} (started with tracing off, "
            "or its spans are still queued: they are written within about a second)",
            EXIT_NOT_FOUND,
        )
    print("\n\n".join(drawn))
    return 0


def register(psub: Any) -> None:
    """`payouts payout trace` under the `payout` subcommands."""
    p = psub.add_parser(
        "trace",
        help="draw a payout's trace as a waterfall (every process, from the local trace files)",
    )
    p.add_argument("payout_id", type=payout_id_arg, help="PAYOUT_ID or payout-PAYOUT_ID")
    p.add_argument("--trace-dir", help="folder of the trace files (default $PAYOUTS_TRACE_DIR)")
    p.add_argument(
        "--sql", action="store_true", help="one line per SQL statement instead of one per parent"
    )
    p.set_defaults(func=guard(_cmd_trace))
