"""Structured JSON events (structlog) with stable names.

Event names are the contract that alerts filter on (NFR-08), e.g. `lock.acquired`,
`lock.fenced_out`, `payout.transition`, `rail.submit`: never rename one casually, and never
filter on message text. Unbounded identifiers (keys, ids, tokens) go into event fields, never
into metric labels (NFR-09). An event emitted inside a trace carries its `trace_id` and
`span_id` (W3C hex, common.tracing): from a log line to the payout's waterfall and back.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

#: Libraries whose INFO lines are per-request chatter (httpx logs every request with its URL,
#: which carries ids): only their warnings and errors are kept.
_CHATTY = ("httpx", "httpcore", "hpack", "asyncio")


#: Tracebacks as data, without the frames' local variables (they can hold tokens and secrets).
_TRACEBACKS = structlog.processors.ExceptionRenderer(
    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
)


def _name_library_record(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A line from a library's stdlib logger becomes an event with a stable name,
    `log.<logger name>`, and its free text goes to `message`: alerts filter on names only."""
    record: logging.LogRecord | None = event_dict.get("_record")
    name = record.name if record is not None else "root"
    event_dict["message"] = str(event_dict.pop("event", ""))
    event_dict["event"] = f"log.{name}"
    return event_dict


def add_trace_ids(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The current span's trace and span ids, when there is one (nothing outside a trace)."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
        event_dict["span_id"] = format(ctx.span_id, "016x")
    return event_dict


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """sys.excepthook of a service: its crash is a JSON event too (`process.crashed`)."""
    get_logger("crash").critical("process.crashed", exc_info=(exc_type, exc, tb))


def configure_logging(
    component: str, *, level: str = "INFO", stream: Any = None, service: bool = False
) -> None:
    """One JSON object per line on stderr (or `stream`), each with `event`, `component`, `ts`.

    Our own events go through structlog; every other line (uvicorn, httpx, the Temporal SDK and
    its workflow logger) goes through the standard library's root logger, whose handler renders
    it as the same kind of JSON object. HTTP servers must be started with `log_config=None` so
    that uvicorn does not install a plain-text handler of its own.

    `service`: a long-running service whose whole log must be JSON (the stack's logs are read
    with jq): Python's warnings and an uncaught exception's traceback become events as well,
    where they would otherwise be printed as text. Not for a command whose user reads stderr."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        add_trace_ids,
    ]
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, _name_library_record, structlog.stdlib.ExtraAdder()],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _TRACEBACKS,
                structlog.processors.JSONRenderer(sort_keys=True, default=str),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    structlog.configure(
        processors=[
            *shared,
            _TRACEBACKS,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(component=component)
    if service:
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
