"""HTTP API of the finance ledger stand-in (FastAPI app factory)."""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry.trace import SpanKind
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common import tracing
from common.correlation import CorrelationMiddleware
from common.credentials import REFUSAL_RESPONSES, load_optional, require
from common.logs import get_logger
from common.strict_query import reject_unknown_query
from finledger.book import Book
from finledger.faults import Action, Faults, decide, is_unknown_account
from finledger.settings import FinledgerSettings

log = get_logger("finledger")

_IDENT = r"^[\x21-\x7e]+$"  # visible ASCII
_IDENT_SPACED = r"^[\x20-\x7e]*$"  # visible ASCII and spaces (a W3C tracestate)
_TRACEPARENT = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
_FLAGS = "finledger.flags"
#: Components that read what the ledger recorded with their own credential (besides operators).
_READERS = ("outbox", "invariants", "reconciler")


class RecordIn(BaseModel):
    """One posting or payout event, as the outbox publisher sends it."""

    event_id: str = Field(min_length=1, max_length=64)
    event_type: str = Field(min_length=1, max_length=64, pattern=_IDENT)
    account_id: str = Field(min_length=1, max_length=128, pattern=_IDENT)
    occurred_at: str = Field(min_length=1, max_length=64)
    contract_version: str = Field(min_length=1, max_length=32)
    payload: dict[str, Any]


class BatchItem(RecordIn):
    """One record of a batch, with the key it is booked under (the single write's path) and the
    W3C trace context of its delivery (the single write's `traceparent` header): one batch holds
    items of several payouts' traces, and each booking joins its own (docs/tracing.md)."""

    correlation_id: str = Field(min_length=1, max_length=256, pattern=_IDENT)
    traceparent: str | None = Field(default=None, max_length=55, pattern=_TRACEPARENT)
    tracestate: str | None = Field(default=None, max_length=512, pattern=_IDENT_SPACED)

    def record(self) -> RecordIn:
        envelope = {"correlation_id", "traceparent", "tracestate"}
        return RecordIn.model_construct(**self.model_dump(exclude=envelope))

    def trace_context(self) -> dict[str, str | None]:
        return {"traceparent": self.traceparent, "tracestate": self.tracestate}


class BatchIn(BaseModel):
    """Up to 1000 records in one request (the publisher's claimed batch)."""

    records: list[BatchItem] = Field(min_length=1, max_length=1000)


class ItemResult(BaseModel):
    """One item's answer: `status` is what the single write would have answered (201 created,
    200 duplicate, 409 conflict, 404 unknown account, 503 unavailable)."""

    correlation_id: str
    status: int
    result: str | None = None  # created | duplicate (a 201/200)
    seq: int | None = None
    code: str | None = None  # CONFLICT | UNKNOWN_ACCOUNT | UNAVAILABLE
    existing_fingerprint: str | None = None  # a 409's


class BatchOut(BaseModel):
    results: list[ItemResult]  # in the order of the request's records


class DropConnection:
    """Pure ASGI middleware: when the endpoint flagged the request, the response start is sent
    and the app returns without a body, so uvicorn closes the connection: the client sees a
    dropped connection, not an HTTP status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        flags: dict[str, bool] = {}
        scope[_FLAGS] = flags

        async def guarded_send(message: Message) -> None:
            if flags.get("drop"):
                if message["type"] == "http.response.start":
                    await send(message)
                return  # swallow the body: the response never completes
            await send(message)

        await self.app(scope, receive, guarded_send)


class LedgerState:
    """Everything the ledger knows; one per app, no module-level state."""

    def __init__(self, settings: FinledgerSettings) -> None:
        self.settings = settings
        # Opened, not cleared: a restarted ledger on the same file knows every record it booked.
        self.book = Book(settings.book_path)
        self.registry = CollectorRegistry()
        self.writes = Counter(
            "finledger_writes", "Write requests by answer", ["answer"], registry=self.registry
        )
        self.batches = Counter(
            "finledger_batches", "Batch write requests answered", registry=self.registry
        )
        self.set_faults(settings.faults())

    def reset(self) -> None:
        """The test controls' reset: the start-up behaviour, an empty book and history."""
        self.set_faults(self.settings.faults())
        self.book.clear()

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self.rule_uses = [0] * len(faults.rules)


@dataclass(frozen=True)
class Applied:
    """The answer to one record write, whether it came alone or in a batch."""

    status: int
    content: dict[str, Any]
    #: The reply must be lost (an injected dropped connection): for a batch, the whole reply.
    drop: bool = False


async def _apply(
    ledger: LedgerState, correlation_id: str, body: RecordIn, *, batch: int | None = None
) -> Applied:
    """One write: the fault decision, then the book (see `write_record`)."""
    entry = ledger.book.begin(correlation_id, batch=batch)
    decision = decide(ledger.faults, ledger.rule_uses, correlation_id, body.account_id)
    answer = "aborted"  # overwritten on every path that answers
    try:
        if decision.latency_s:
            await asyncio.sleep(decision.latency_s)
        if decision.action is Action.FAIL:
            answer = f"fail_{decision.status}"
            return Applied(decision.status, {"code": "UNAVAILABLE"})
        if decision.action is Action.DROP:
            answer = "dropped"
            return Applied(500, {"code": "DROPPED"}, drop=True)
        if is_unknown_account(ledger.faults, body.account_id):
            answer = "unknown_account"
            return Applied(404, {"code": "UNKNOWN_ACCOUNT"})
        # Booked at most once per correlation id (the publisher's delivery key): a redelivery
        # of the same record, alone or in a batch, answers duplicate (200) and books nothing.
        result, record = ledger.book.write(correlation_id, **body.model_dump())
        answer = result
        log.info("finledger.write", result=result, correlation_id=correlation_id)
        if decision.action is Action.DROP_AFTER_RECORD:
            answer = f"{result}_then_dropped"
            return Applied(500, {"code": "DROPPED"}, drop=True)
        if result == "conflict":
            return Applied(409, {"code": "CONFLICT", "existing_fingerprint": record["fingerprint"]})
        content = {"status": result, "correlation_id": correlation_id, "seq": record["seq"]}
        return Applied(201 if result == "created" else 200, content)
    finally:
        ledger.book.end(entry, answer)
        ledger.writes.labels(answer=answer).inc()


async def _apply_item(ledger: LedgerState, item: BatchItem, batch: int) -> Applied:
    """One item of a batch, booked in its own delivery's trace (span `finledger.book`)."""
    with tracing.continued(
        "finledger.book",
        item.trace_context(),
        kind=SpanKind.CONSUMER,
        attributes={"finledger.correlation_id": item.correlation_id, "finledger.batch": batch},
    ) as span:
        applied = await _apply(ledger, item.correlation_id, item.record(), batch=batch)
        span.set_attribute("http.response.status_code", applied.status)
        return applied


async def _write(
    ledger: LedgerState, flags: dict[str, bool], correlation_id: str, body: RecordIn
) -> Response:
    applied = await _apply(ledger, correlation_id, body)
    if applied.drop:
        flags["drop"] = True
        return Response(status_code=500, content=b"x" * 64)
    return JSONResponse(status_code=applied.status, content=applied.content)


async def _write_batch(
    ledger: LedgerState, flags: dict[str, bool], body: BatchIn
) -> BatchOut | Response:
    """Every item applied as if it came alone (concurrently: a slow item delays the reply, not
    the others' booking); one item's answer never changes another's. An injected drop on any
    item loses the whole reply, after the other items were booked: the publisher resends the
    batch and the book answers duplicate for what it already holds."""
    batch = ledger.book.next_batch()
    applied = await asyncio.gather(*(_apply_item(ledger, item, batch) for item in body.records))
    ledger.batches.inc()
    if any(a.drop for a in applied):
        flags["drop"] = True
        return Response(status_code=500, content=b"x" * 64)
    return BatchOut(
        results=[
            ItemResult(
                correlation_id=item.correlation_id,
                status=a.status,
                result=a.content.get("status"),
                seq=a.content.get("seq"),
                code=a.content.get("code"),
                existing_fingerprint=a.content.get("existing_fingerprint"),
            )
            for item, a in zip(body.records, applied, strict=True)
        ]
    )


def create_app(settings: FinledgerSettings | None = None) -> FastAPI:
    settings = settings or FinledgerSettings()
    app = FastAPI(
        title="finance ledger stand-in",
        version="1",
        lifespan=_lifespan(settings),
        responses=REFUSAL_RESPONSES,  # every route but /health and /metrics needs a credential
        dependencies=[Depends(reject_unknown_query)],
    )
    # Who may call what: writes only the outbox publisher; reads the publisher, the checkers
    # and operators; /admin/* operators only (reads also the checkers); /health and /metrics
    # open (network isolation). A refused call is answered 401/403 before anything is recorded.
    credentials = load_optional(settings.credentials_path)  # None: authentication off (tests)
    writer = [Depends(require(credentials, components=("outbox",)))]
    readers = [Depends(require(credentials, operator=True, components=_READERS))]
    operators = [Depends(require(credentials, operator=True))]
    app.add_middleware(DropConnection)
    app.add_middleware(CorrelationMiddleware)  # X-Correlation-Id, per request

    def state() -> LedgerState:
        ledger: LedgerState = app.state.ledger
        return ledger

    _add_record_routes(app, state, writer, readers)
    _add_operation_routes(app, state)
    _add_admin_routes(app, state, readers, operators)
    return app


def _lifespan(
    settings: FinledgerSettings,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start-up: the ledger state (its book reopened, faults, metrics) for the app; shutdown
    closes the book."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ledger = LedgerState(settings)
        app.state.ledger = ledger
        log.info(
            "finledger.started",
            port=settings.port,
            book_path=str(settings.book_path) if settings.book_path else None,
            records=ledger.book.count(),
        )
        try:
            yield
        finally:
            ledger.book.close()

    return lifespan


def _add_record_routes(
    app: FastAPI, state: Callable[[], LedgerState], writer: list[Any], readers: list[Any]
) -> None:
    """The book: the single and the batch write (the outbox publisher only) and what it holds."""

    @app.put(
        "/v1/records/{correlation_id}",
        status_code=201,
        responses={
            200: {},
            400: {"description": "the body could not be parsed"},
            404: {},
            409: {},
            503: {},
        },
        dependencies=writer,
    )
    async def write_record(
        request: Request,
        body: RecordIn,
        correlation_id: str = Path(min_length=1, max_length=256, pattern=_IDENT),
    ) -> Any:
        """Record once per correlation id: 201 created, 200 duplicate, 409 conflict, 404 unknown
        account (permanent), 503 unavailable (transient; nothing recorded)."""
        return await _write(state(), request.scope[_FLAGS], correlation_id, body)

    @app.post(
        "/v1/records:batch",
        response_model=BatchOut,
        responses={400: {"description": "the body could not be parsed"}},
        dependencies=writer,
    )
    async def write_batch(request: Request, body: BatchIn) -> Any:
        """Record each item once per correlation id, exactly as `PUT /v1/records/{id}` would:
        200 with one result per item, in order, each with the status the single write would
        have answered. One item's failure (404, 409, 503) never fails the others."""
        return await _write_batch(state(), request.scope[_FLAGS], body)

    @app.get("/v1/records", dependencies=readers)
    async def list_records(account_id: str | None = None) -> dict[str, Any]:
        """What the ledger recorded, in arrival order, with the count."""
        records = state().book.snapshot(account_id)
        return {"records": records, "count": len(records)}

    @app.get("/v1/count", dependencies=readers)
    async def count() -> dict[str, int]:
        return {"count": state().book.count()}


def _add_operation_routes(app: FastAPI, state: Callable[[], LedgerState]) -> None:
    """Health (503 while the faults say the ledger is down) and metrics: open (network
    isolation)."""

    @app.get("/health")
    async def health() -> Any:
        if state().faults.down:
            return JSONResponse(status_code=503, content={"code": "UNAVAILABLE"})
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)  # Prometheus text, as on every service
    async def metrics() -> Response:
        return Response(generate_latest(state().registry), media_type=CONTENT_TYPE_LATEST)


def _add_admin_routes(
    app: FastAPI, state: Callable[[], LedgerState], readers: list[Any], operators: list[Any]
) -> None:
    """The test controls: the faults (read by the checkers too), the reset, and the request
    history the tests read as evidence."""

    @app.get("/admin/faults", response_model=Faults, dependencies=readers)
    async def get_faults() -> Faults:
        return state().faults

    @app.put("/admin/faults", response_model=Faults, dependencies=operators)
    async def put_faults(faults: Faults) -> Faults:
        """Replace the behaviour as a whole (rule use counts restart at zero)."""
        state().set_faults(faults)
        log.info("finledger.faults_changed", down=faults.down, rules=len(faults.rules))
        return faults

    @app.post("/admin/reset", dependencies=operators)
    async def reset() -> dict[str, str]:
        """Empty the book and the history; restore the start-up behaviour."""
        state().reset()
        return {"status": "reset"}

    @app.get("/admin/requests", dependencies=readers)
    async def requests() -> dict[str, Any]:
        """The evidence: every write request with logical start/finish ticks and its answer."""
        book = state().book
        history = book.requests()
        return {
            "requests": history,
            "in_flight": sum(1 for e in history if e["finished"] is None),
            "counts": dict(Tally(e["correlation_id"] for e in history)),
        }
