"""common.tracing's sampler and common.tracefile's format, with spans of a real SDK provider
built by `tracer_provider` (never installed globally: the test process stays untraced)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from common import tracing
from common.logs import configure_logging
from common.tracefile import (
    NOT_STARTED,
    PAYOUT_ROOT,
    SpanRecord,
    orphans,
    payout_trace_ids,
    read_spans,
    span_line,
    trace_of,
)
from payouts.trace_cli import waterfall


def _provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[TracerProvider, InMemorySpanExporter]:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    provider = tracing.tracer_provider("unit", trace_dir=tmp_path)
    assert provider is not None
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def test_unit_background_work_starts_no_trace_and_a_payout_is_kept_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root CLIENT span (a poll, a heartbeat) is dropped and so is everything under it, and so
    is a root Temporal span (its start did not trace); any other root is kept, and so are its
    CLIENT children (parent-based)."""
    provider, memory = _provider(tmp_path, monkeypatch)
    tracer = provider.get_tracer("unit")
    with tracer.start_as_current_span("SELECT", kind=SpanKind.CLIENT) as poll:
        assert not poll.get_span_context().trace_flags.sampled
        with tracer.start_as_current_span("POST /v1/heartbeat", kind=SpanKind.SERVER) as served:
            assert not served.is_recording()
    with tracer.start_as_current_span(PAYOUT_ROOT, kind=SpanKind.INTERNAL) as root:
        assert root.is_recording()
        with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT) as call:
            assert call.is_recording()
    with tracer.start_as_current_span("GET /admin", kind=SpanKind.SERVER) as request:
        assert request.is_recording()  # a request from outside any trace: its own trace
    fragment = {"temporalActivityID": "1", "temporalWorkflowID": "reconcile-hourly"}
    with tracer.start_as_current_span(
        "RunActivity:reconcile", kind=SpanKind.SERVER, attributes=fragment
    ) as run:
        assert not run.is_recording()  # its start did not trace: no fragment of a trace
    assert [s.name for s in memory.get_finished_spans()] == ["POST", PAYOUT_ROOT, "GET /admin"]


def test_unit_disabled_means_no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SDK_DISABLED=true: no provider, so nothing is set up or instrumented."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.tracer_provider("unit") is None


def test_unit_flush_is_harmless_when_tracing_is_off() -> None:
    """This test process never installs a provider: nothing to export, and no error."""
    assert not tracing.enabled()
    assert tracing.flush() is True


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OTEL_TRACES_SAMPLER_ARG", "lots"), ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
     ("OTEL_BSP_MAX_QUEUE_SIZE", "-1"), ("OTEL_BSP_SCHEDULE_DELAY", "soon")],
)  # fmt: skip
def test_unit_a_bad_setting_is_one_clear_error(
    variable: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampling ratio outside 0..1 or a batch setting that is not a positive integer is
    refused with the variable's name, never silently replaced."""
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        tracing.tracer_provider("unit", trace_dir=tmp_path)


def test_unit_the_file_holds_one_line_per_span_and_reads_back_as_a_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider's file exporter writes `<service>-<pid>.jsonl`, one JSON line per span; read
    back, the payout's root finds its trace, a refused start's root finds none, a cut-off line
    is skipped, and a span whose parent is missing is an orphan."""
    provider, _ = _provider(tmp_path, monkeypatch)
    tracer = provider.get_tracer("unit")
    with (
        tracer.start_as_current_span(PAYOUT_ROOT, attributes={"payout.id": "p1"}),
        tracer.start_as_current_span("RunActivity:x", kind=SpanKind.SERVER),
    ):
        pass
    with tracer.start_as_current_span(PAYOUT_ROOT, attributes={"payout.id": "p1"}) as refused:
        refused.set_attribute(NOT_STARTED, True)
    provider.shutdown()
    files = list(tmp_path.glob("unit-*.jsonl"))
    assert len(files) == 1
    lines = files[0].read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["service"] == "unit" for line in lines)
    with files[0].open("a") as f:
        f.write('{"trace_id": "cut')  # a process killed mid-write
    spans = read_spans(tmp_path)
    assert len(spans) == 3
    (trace_id,) = payout_trace_ids(spans, "p1")
    trace = trace_of(spans, trace_id)
    assert [s.name for s in trace] == [PAYOUT_ROOT, "RunActivity:x"]
    assert trace[1].parent_id == trace[0].span_id and orphans(trace) == []
    assert orphans(trace[1:]) == [trace[1]]


def test_unit_a_span_line_keeps_no_resource_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, memory = _provider(tmp_path, monkeypatch)
    with provider.get_tracer("unit").start_as_current_span("SELECT", kind=SpanKind.SERVER):
        pass
    line = json.loads(span_line(memory.get_finished_spans()[0]))
    assert set(line) == {
        "trace_id", "span_id", "parent_id", "name", "kind", "service", "instance", "start_ns",
        "end_ns", "status", "attributes", "links",
    }  # fmt: skip
    assert line["instance"].startswith("unit-")


def test_unit_every_event_in_a_span_carries_its_trace_and_span_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """structlog events and stdlib lines alike get `trace_id`/`span_id` inside a span, and
    neither outside one."""
    provider, _ = _provider(tmp_path, monkeypatch)
    stream = io.StringIO()
    configure_logging("unit", stream=stream)
    log = structlog.get_logger("unit")
    log.info("unit.outside")
    with provider.get_tracer("unit").start_as_current_span("op", kind=SpanKind.SERVER) as span:
        log.info("unit.inside")
        import logging

        logging.getLogger("lib").warning("library line")
    ctx = span.get_span_context()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    outside, inside, library = events
    assert "trace_id" not in outside and "span_id" not in outside
    for e in (inside, library):
        assert e["trace_id"] == f"{ctx.trace_id:032x}" and e["span_id"] == f"{ctx.span_id:016x}"


def test_unit_a_stored_context_continues_its_trace() -> None:
    """`carrier` writes only the W3C fields of the current span; `attached` makes such fields
    current again (what the outbox does with a row's stored context)."""
    provider = TracerProvider()  # the default sampler: everything kept
    with provider.get_tracer("unit").start_as_current_span("staged") as staged:
        fields = tracing.carrier()
    assert set(fields) == {"traceparent"}
    assert fields["traceparent"].split("-")[1] == f"{staged.get_span_context().trace_id:032x}"
    with tracing.attached(fields):
        current = trace.get_current_span().get_span_context()
        assert current.span_id == staged.get_span_context().span_id and current.is_remote
    assert not trace.get_current_span().get_span_context().is_valid
    assert tracing.carrier() == {}  # outside any trace: nothing to store


def _span(
    name: str, span_id: str, parent: str | None, start: int, end: int, **attrs: object
) -> SpanRecord:
    return SpanRecord(
        trace_id="t" * 32, span_id=span_id, parent_id=parent, name=name, kind="INTERNAL",
        service="svc", instance="svc-1", start_ns=start * 1_000_000, end_ns=end * 1_000_000,
        status="UNSET", attributes=dict(attrs),
    )  # fmt: skip


def test_unit_the_waterfall_nests_by_parent_and_folds_runs_of_statements() -> None:
    """Children are drawn under their parent in start order; consecutive statements fold into
    one line that says how many (and `sql=True` shows each); bars sit on one time line."""
    trace = [
        _span("root", "a", None, 0, 100),
        _span("BEGIN;", "b", "a", 1, 2, **{"db.system": "postgresql"}),
        _span("UPDATE", "c", "a", 2, 4, **{"db.system": "postgresql"}),
        _span("POST", "d", "a", 10, 90),
        _span("COMMIT;", "e", "a", 95, 96, **{"db.system": "postgresql"}),
    ]
    lines = waterfall(trace, width=20).splitlines()[2:]
    names = [line.rsplit("|  ", 1)[1] for line in lines]
    assert names == [
        "root [svc-1]",
        "  2 SQL statements (3.0 ms) [svc-1]",
        "  POST [svc-1]",
        "  COMMIT; [svc-1]",
    ]
    assert lines[0].split("|")[1] == "#" * 20  # the root spans the whole time line
    assert len(waterfall(trace, sql=True).splitlines()) == 2 + 5
