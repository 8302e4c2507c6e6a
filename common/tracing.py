"""Distributed tracing with OpenTelemetry: one trace per payout across every process (issue 27).

Owns: the process's tracer provider (`setup`, called once by each entry point, and
`tracer_provider` for a benchmark that builds its own), the sampler (`EntryPointSampler`), where
spans go, the maintained instrumentations it applies (asyncpg and httpx for the whole process,
FastAPI per app via `instrument_app`, Temporal's TracingInterceptor via `temporal_interceptors`,
a hand-made httpx transport via `traced_transport`), the root span of a payout's trace
(`payout_root`), and a context carried through a stored row or a batch item as the W3C
`traceparent`/`tracestate` pair (`carrier`, `start_continued`, `continued`, `attached`).

Where spans go: OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the SDK's exporter reads every standard
OTEL_EXPORTER_OTLP_* variable, a CA certificate and a client certificate included); else one
JSON-lines file per process in $PAYOUTS_TRACE_DIR (`common.tracefile`); else nowhere, while the
context still propagates and the logs still carry its ids. OTEL_SDK_DISABLED=true switches all
of it off: no provider, no instrumentation, no header sent.

Must never: record a secret (no SQL parameter and no header is captured, so bearer tokens and
signed grants stay out of spans), put an id into a metric label (NFR-09: ids are span
attributes), make a request fail or wait because of tracing (spans are exported in batches from
the SDK's own thread), or start a trace for background polling (`EntryPointSampler`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from common.tracefile import PAYOUT_ID, PAYOUT_ROOT, file_exporter

#: The folder of the local trace files (one per process); the stack sets it under its run dir.
TRACE_DIR_VAR = "PAYOUTS_TRACE_DIR"
#: Requests that are not work: health probes and Prometheus scrapes start no span at all.
EXCLUDED_URLS = "/health$,/livez$,/readyz$,/metrics$"
_TRACER = "fenced-payouts"
#: The attributes Temporal's TracingInterceptor puts on every span it starts.
_TEMPORAL_IDS = ("temporalWorkflowID", "temporalActivityID")
#: Only the W3C trace context travels in a row or a body: no baggage.
_W3C = TraceContextTextMapPropagator()


def disabled() -> bool:
    """OTEL_SDK_DISABLED=true: the standard switch, honoured by everything here."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def enabled() -> bool:
    """True once `setup` installed this process's SDK tracer provider."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


class EntryPointSampler(Sampler):
    """The decision for a span without a parent (under `ParentBased`, which keeps every child
    with its parent's decision, so a payout's trace is kept or dropped whole).

    Two kinds of root start no trace, and the unsampled context they send makes every process
    after them drop its side too:
    - a CLIENT span: background work, a statement, a heartbeat or a poll that no traced work
      caused (the lock session's heartbeat, the backlog gauge, the outbox's claim);
    - a Temporal span (one carrying a workflow or activity id): work whose start did not trace
      (a starter with tracing off, the hourly reconcile Schedule), which would be a fragment
      of a payout, not its trace.
    Any other root (a payout's start, a request from outside such as an operator's) is kept at
    `ratio` of trace ids (1.0 unless OTEL_TRACES_SAMPLER_ARG)."""

    def __init__(self, ratio: float = 1.0) -> None:
        self._ratio = TraceIdRatioBased(ratio)

    def should_sample(  # noqa: PLR0917 - the SDK's Sampler signature
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        temporal = attributes is not None and any(k in attributes for k in _TEMPORAL_IDS)
        if kind is SpanKind.CLIENT or temporal:
            return SamplingResult(Decision.DROP)
        return self._ratio.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"EntryPointSampler{{{self._ratio.get_description()}}}"


def _ratio() -> float:
    raw = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        value = float(raw) if raw else 1.0
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not a number in 0..1") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not a number in 0..1")
    return value


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r} is not a positive integer")
    return int(raw)


def _exporter(service: str, trace_dir: Path | None) -> SpanExporter | None:
    """OTLP where a collector is configured, else the local file (in `trace_dir`, default
    $PAYOUTS_TRACE_DIR), else None."""
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    folder = trace_dir or os.environ.get(TRACE_DIR_VAR, "").strip()
    if not folder:
        return None
    return file_exporter(Path(folder), service)


def tracer_provider(
    service: str, instance: str | None = None, *, trace_dir: Path | None = None
) -> TracerProvider | None:
    """A provider for `service` (and its `instance`, e.g. a worker's id) with this module's
    sampler and exporter, not installed globally; None when tracing is disabled.

    Batching (BatchSpanProcessor): spans leave in batches from the SDK's thread, never on the
    request's path. A 1 s delay instead of the SDK's 5 s so that a stopped process loses little
    and a waiting test or `payouts payout trace` sees spans soon; a queue of 16,384 instead of
    2,048 so that a burst is not dropped (a payout is about seventy spans, forty of them in its
    worker).
    OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_MAX_QUEUE_SIZE override both."""
    if disabled():
        return None
    provider = TracerProvider(
        sampler=ParentBased(root=EntryPointSampler(_ratio())),
        # The instance names the process in a waterfall: a worker's id, else service-pid.
        resource=Resource.create(
            {"service.name": service, "service.instance.id": instance or f"{service}-{os.getpid()}"}
        ),
    )
    exporter = _exporter(service, trace_dir)
    if exporter is not None:
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=_int_env("OTEL_BSP_MAX_QUEUE_SIZE", 16_384),
                schedule_delay_millis=_int_env("OTEL_BSP_SCHEDULE_DELAY", 1_000),
            )
        )
    return provider


def setup(service: str, instance: str | None = None, *, trace_dir: Path | None = None) -> bool:
    """Install `service`'s tracer provider and instrument asyncpg and httpx for this process;
    True if tracing is on. `trace_dir` overrides $PAYOUTS_TRACE_DIR (a lab run that keeps its
    spans beside its stacks'). Idempotent: a second call (another entry point in the same
    process) changes nothing."""
    if enabled():
        return True
    provider = tracer_provider(service, instance, trace_dir=trace_dir)
    if provider is None:
        return False
    trace.set_tracer_provider(provider)
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    # Statements only (capture_parameters off): a parameter can be a signed grant.
    AsyncPGInstrumentor(capture_parameters=False).instrument()  # type: ignore[no-untyped-call]
    # Every client on httpx's own transports; the lock SDK's transport: `traced_transport`.
    HTTPXClientInstrumentor().instrument()
    return True


def shutdown() -> None:
    """Export what is still queued and stop the provider (before the process leaves by
    `os._exit`, which skips the SDK's own exit hook). Safe to call when tracing is off."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def flush() -> bool:
    """Export what is queued now, tracing staying on (a process that reads its own spans back
    from its file); True if everything was exported, or tracing is off."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        return provider.force_flush()
    return True


def instrument_app(app: Any) -> Any:
    """The FastAPI app with a server span per request, continuing the caller's `traceparent`;
    no spans for health probes and scrapes, and none for each ASGI send/receive (two extra
    spans per request that only say the body moved)."""
    if enabled():
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(
            app, excluded_urls=EXCLUDED_URLS, exclude_spans=["receive", "send"]
        )
    return app


def traced_transport(transport: Any) -> Any:
    """`transport` wrapped by the httpx instrumentation's own transport when tracing is on: for
    a transport that is not httpx's (the lock SDK's keep-alive transport), which the global
    instrumentation cannot reach."""
    if not enabled():
        return transport
    from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport

    return AsyncOpenTelemetryTransport(transport)


def temporal_interceptors() -> list[Any]:
    """Temporal's TracingInterceptor for `Client.connect` (the workers of that client get it
    too): spans for a workflow's start, run, activities, signals and continue-as-new, and the
    context in every header. Empty when tracing is off."""
    if not enabled():
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


@contextlib.contextmanager
def payout_root(payout_id: str, account_id: str) -> Iterator[Span]:
    """The root span of one payout's trace, around its workflow's start.

    A new trace whatever is current (a re-drive runs inside the reconcile activity's trace,
    which it links to), so that each payout has a trace of its own; the interceptor puts this
    context on the workflow's start, hence on every task, activity and continue-as-new of it.
    Yields the root span (non-recording when tracing is off)."""
    if not enabled():
        yield trace.INVALID_SPAN
        return
    current = trace.get_current_span().get_span_context()
    with trace.get_tracer(_TRACER).start_as_current_span(
        PAYOUT_ROOT,
        context=otel_context.Context(),
        kind=SpanKind.INTERNAL,
        attributes={PAYOUT_ID: payout_id, "payout.account_id": account_id},
        links=[Link(current)] if current.is_valid else [],
    ) as span:
        yield span


def carrier(span: Span | None = None) -> dict[str, str]:
    """`span`'s context (default: the current one) as W3C fields: `traceparent`, and
    `tracestate` when there is one; empty outside any trace."""
    out: dict[str, str] = {}
    ctx = trace.set_span_in_context(span) if span is not None else None
    _W3C.inject(out, context=ctx)
    return out


def start_continued(
    name: str,
    headers: Mapping[str, str | None],
    *,
    kind: SpanKind = SpanKind.CONSUMER,
    attributes: Attributes = None,
) -> Span:
    """A span in the trace of a stored or sent context (`traceparent`, `tracestate`), started
    and not made current; the caller ends it. A non-recording span when the context is absent
    or invalid (the row was written outside any trace): nothing is recorded for it."""
    parent = _W3C.extract({k: v for k, v in headers.items() if v})
    if not enabled() or not trace.get_current_span(parent).get_span_context().is_valid:
        return trace.INVALID_SPAN
    return trace.get_tracer(_TRACER).start_span(
        name, context=parent, kind=kind, attributes=attributes
    )


@contextlib.contextmanager
def continued(
    name: str,
    headers: Mapping[str, str | None],
    *,
    kind: SpanKind = SpanKind.CONSUMER,
    attributes: Attributes = None,
) -> Iterator[Span]:
    """`start_continued`, current for the block and ended after it."""
    span = start_continued(name, headers, kind=kind, attributes=attributes)
    with trace.use_span(span, end_on_exit=True):
        yield span


@contextlib.contextmanager
def attached(headers: Mapping[str, str | None]) -> Iterator[None]:
    """The context of `headers` (`traceparent`, `tracestate`) current for the block, without a
    span of its own: what the block's requests and statements record is parented to it."""
    fields = {k: v for k, v in headers.items() if v}
    if not fields:
        yield
        return
    token = otel_context.attach(_W3C.extract(fields))
    try:
        yield
    finally:
        otel_context.detach(token)
