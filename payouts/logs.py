"""Structured JSON events (structlog) with stable names.

Event names are the contract that alerts filter on (NFR-08), e.g. `lock.acquired`,
`lock.fenced_out`, `payout.transition`, `rail.submit`: never rename one casually, and never
filter on message text. Unbounded identifiers (keys, ids, tokens) go into event fields, never
into metric labels (NFR-09).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(component: str, *, level: str = "INFO", stream: Any = None) -> None:
    """One JSON object per line on stderr (or `stream`), each with `event`, `component`, `ts`."""
    logging.basicConfig(level=level, stream=stream or sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(component=component)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
