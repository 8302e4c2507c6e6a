"""HTTP API of the rail stub (FastAPI app factory).

Who may call what (common.credentials, docs/rail.md "Credentials"): `/payments` and `/lookup`
only the rail proxy (a real rail authenticates its client); `GET /admin/identity`,
`GET /admin/behaviour` and `GET /admin/movements` the proxy, the reconciler, the invariant
checker and operators (read-only); `POST /admin/behaviour` and `POST /admin/reset` operators
only. `/health` and `/metrics` stay open (network isolation). A refused call is answered 401/403
before its handler runs: nothing is recorded, no behaviour changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import Depends, FastAPI, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, Field

from common.correlation import CorrelationMiddleware
from common.credentials import REFUSAL_RESPONSES, load_optional, require
from common.logs import get_logger
from common.strict_query import reject_unknown_query
from railstub.behaviour import Action, Behaviour, decide
from railstub.movements import LookupStatus, Movement, MovementLog
from railstub.settings import StubSettings

log = get_logger("railstub")

# Visible ASCII only: the rail's identifiers never carry spaces or control characters.
_IDENT = r"^[\x21-\x7e]+$"


class PaymentRequest(BaseModel):
    client_reference: str = Field(min_length=1, max_length=128, pattern=_IDENT)
    account_id: str = Field(min_length=1, max_length=128, pattern=_IDENT)
    amount: int = Field(gt=0, le=10**15)


class PaymentResponse(BaseModel):
    movement_id: str
    client_reference: str
    status: Literal["settled", "pending", "declined"]
    reason: str | None = None


class NotAccepted(BaseModel):
    """503 body: the rail did not accept the instruction; nothing was recorded."""

    code: Literal["NOT_ACCEPTED"] = "NOT_ACCEPTED"
    message: str = "provider unavailable"


class LookupResponse(BaseModel):
    client_reference: str
    status: LookupStatus
    # The rail's consistency statement, on the rail's clock: every submission it received
    # from `complete_from` until `complete_through` is reflected in `status`. A `not_found` is
    # definitive only for a submission that could not have reached the rail outside that window.
    complete_through: datetime
    complete_from: datetime


class BehaviourPatch(BaseModel):
    """Fields to replace in the current behaviour (unset fields are kept)."""

    latency_mode: str | None = Field(default=None, pattern="^(lognormal|fixed)$")
    latency_fixed_ms: int | None = Field(default=None, ge=0, le=600_000)
    latency_p50_ms: float | None = Field(default=None, gt=0)
    latency_p99_ms: float | None = Field(default=None, gt=0)
    ambiguity_rate: float | None = Field(default=None, ge=0, le=1)
    decline_rate: float | None = Field(default=None, ge=0, le=1)
    delayed_rate: float | None = Field(default=None, ge=0, le=1)
    outage: bool | None = None
    completion_delay_s: float | None = Field(default=None, ge=0, le=86_400)
    visibility_delay_s: float | None = Field(default=None, ge=0, le=86_400)
    stall_s: float | None = Field(default=None, ge=0, le=86_400)
    clock_skew_s: float | None = Field(default=None, ge=-3600, le=3600)
    rules: list[Any] | None = None


class StubMetrics:
    """The stub's Prometheus metrics, in a registry of its own (one per app). Labels are closed
    sets (the action decided, the lookup status), never a reference or an account (NFR-09)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.instructions = Counter(
            "railstub_instructions_total",
            "Submissions by what the rail did with them",
            ["action"],
            registry=self.registry,
        )
        self.lookups = Counter(
            "railstub_lookups_total", "Lookups by answer", ["status"], registry=self.registry
        )


class StubState:
    """Everything the stub knows; one per app, no module-level state."""

    def __init__(self, settings: StubSettings) -> None:
        self.settings = settings
        self.metrics = StubMetrics()
        # Opened (not cleared) at start: a restarted stub on the same file keeps its evidence.
        self.log = MovementLog(settings.movements_path)
        self.restore()

    def restore(self) -> None:
        """The start-up behaviour and seed; stalls released. The movement log is kept."""
        self.behaviour = self.settings.behaviour()
        self.rng = random.Random(self.settings.seed)
        self.release_stalls()

    def reset(self) -> None:
        self.restore()
        self.log.clear()

    def reported(self, epoch_s: float) -> datetime:
        """A true wall-clock instant as this rail reports it: on its own, possibly skewed, clock."""
        return datetime.fromtimestamp(epoch_s + self.behaviour.clock_skew_s, UTC)

    def release_stalls(self) -> None:
        # A stalled request waits on the event it saw; setting it frees them all, a fresh one
        # serves the next stalls.
        old = getattr(self, "stall_release", None)
        if old is not None:
            old.set()
        self.stall_release = asyncio.Event()

    async def stall(self) -> JSONResponse:
        release = self.stall_release
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), timeout=self.behaviour.stall_s)
        return JSONResponse(status_code=504, content={"code": "STALLED"})


def _unavailable() -> JSONResponse:
    return JSONResponse(status_code=503, content=NotAccepted().model_dump())


def _receive(
    stub: StubState, req: PaymentRequest, action: Action, latency_s: float
) -> Movement | None:
    """Record an instruction the moment the rail receives it, pending until its latency (and a
    delayed completion) has passed; an instruction that never reaches the rail is not recorded."""
    stub.metrics.instructions.labels(action=action.value).inc()
    if action in (Action.UNAVAILABLE, Action.TIMEOUT_BEFORE):
        return None
    delay = stub.behaviour.completion_delay_s if action is Action.DELAYED else 0.0
    movement = stub.log.record(
        client_reference=req.client_reference,
        account_id=req.account_id,
        amount=req.amount,
        declined=action is Action.DECLINE,
        pending_s=latency_s + delay,
    )
    log.info("railstub.movement", action=action.value, client_reference=req.client_reference)
    return movement


def _evidence(stub: StubState, m: Movement, now: float) -> dict[str, object]:
    return {
        "movement_id": m.movement_id,
        "client_reference": m.client_reference,
        "account_id": m.account_id,
        "amount": m.amount,
        "status": m.status(now),
        "recorded_at": stub.reported(m.recorded_at).isoformat(),
        "settles_at": stub.reported(m.settles_at).isoformat(),
    }


def create_app(settings: StubSettings | None = None) -> FastAPI:
    settings = settings or StubSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.stub = StubState(settings)
        log.info("railstub.started", seed=settings.seed)
        yield
        app.state.stub.release_stalls()
        app.state.stub.log.close()

    app = FastAPI(
        title="rail stub",
        version="1",
        lifespan=lifespan,
        responses=REFUSAL_RESPONSES,  # every route but /health and /metrics needs a credential
        dependencies=[Depends(reject_unknown_query)],
    )
    credentials = load_optional(settings.credentials_path)  # None: authentication off (tests)
    client = [Depends(require(credentials, components=("railproxy",)))]
    app.add_middleware(CorrelationMiddleware)  # X-Correlation-Id, per request

    def state() -> StubState:
        stub: StubState = app.state.stub
        return stub

    @app.post(
        "/payments",
        response_model=PaymentResponse,
        responses={
            202: {"model": PaymentResponse},
            400: {"description": "the body could not be parsed"},
            # The rail's faults the stub simulates when its behaviour says so (off by default):
            500: {"description": "ambiguity: the movement was recorded, the answer is lost"},
            503: {"model": NotAccepted},
            504: {"description": "a stall: the answer never came in time"},
        },
        dependencies=client,
    )
    async def submit_payment(req: PaymentRequest) -> Any:
        """Submit a payment. Non-idempotent: the same client_reference twice moves money twice."""
        stub = state()
        action, latency_s = decide(stub.behaviour, stub.rng, req.amount, req.client_reference)
        movement = _receive(stub, req, action, latency_s)
        await asyncio.sleep(latency_s)
        if movement is None:
            if action is Action.UNAVAILABLE:
                return _unavailable()
            return await stub.stall()  # never recorded: the instruction was lost before the rail
        if action is Action.TIMEOUT_AFTER:
            return await stub.stall()
        if action is Action.AMBIGUOUS:
            return JSONResponse(status_code=500, content={"code": "INTERNAL"})
        # The answer is the movement's status once its latency has passed (a delayed one is
        # still pending then), computed from the record rather than from a second clock read.
        status = movement.status(movement.recorded_at + latency_s)
        body = PaymentResponse(
            movement_id=movement.movement_id,
            client_reference=req.client_reference,
            status=status,
            reason="DECLINED_BY_RAIL" if status == "declined" else None,
        )
        return JSONResponse(
            status_code=202 if status == "pending" else 200, content=body.model_dump()
        )

    @app.get(
        "/lookup",
        response_model=LookupResponse,
        responses={503: {"model": NotAccepted}},
        dependencies=client,
    )
    async def lookup(client_reference: str = Query(min_length=1, max_length=128)) -> Any:
        """Read-only status by client reference, eventually consistent (visibility_delay_s)."""
        stub = state()
        if stub.behaviour.outage:
            return _unavailable()
        delay = stub.behaviour.visibility_delay_s
        now = time.time()
        status = stub.log.lookup(client_reference, delay, now)
        stub.metrics.lookups.labels(status=status).inc()
        # What this statement rests on: every instruction is recorded at receipt (the handler
        # records before any await, so a lookup on this event loop sees it or it was not yet
        # received), a movement recorded before `now - delay` is visible, and the log holds every
        # record since `records_since` (while the stub is down it receives nothing, so a durable
        # log stays complete across restarts). Never earlier than `records_since`: the window
        # [complete_from, complete_through] is then empty rather than reversed.
        since = stub.log.records_since
        return LookupResponse(
            client_reference=client_reference,
            status=status,
            complete_through=stub.reported(max(now - delay, since)),
            complete_from=stub.reported(since),
        )

    @app.get("/health", responses={503: {"model": NotAccepted}})
    async def health() -> Any:
        if state().behaviour.outage:
            return _unavailable()
        return {"status": "ok"}

    readers = [
        Depends(require(credentials, operator=True, components=("railproxy", *MOVEMENT_READERS)))
    ]
    operators = [Depends(require(credentials, operator=True))]
    _add_admin_routes(app, state, readers, operators)
    return app


#: Components that read the movement log (the evidence) with their own credential.
MOVEMENT_READERS = ("reconciler", "invariants")


def _add_admin_routes(
    app: FastAPI, state: Callable[[], StubState], readers: list[Any], operators: list[Any]
) -> None:
    """Metrics and the admin endpoints: how tests and experiments steer and read the stub."""

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(state().metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/identity", dependencies=readers)
    async def identity() -> dict[str, str]:
        """Who this is: the rail stub. The rail proxy's experiment mode requires it (FR-29)."""
        return {"rail": "stub"}

    @app.get("/admin/behaviour", response_model=Behaviour, dependencies=readers)
    async def get_behaviour() -> Behaviour:
        return state().behaviour

    @app.post(
        "/admin/behaviour", response_model=Behaviour, responses={422: {}}, dependencies=operators
    )
    async def set_behaviour(patch: BehaviourPatch) -> Any:
        """Replace the named fields of the current behaviour (validated as a whole)."""
        stub = state()
        merged = stub.behaviour.model_dump() | patch.model_dump(exclude_none=True)
        try:
            stub.behaviour = Behaviour.model_validate(merged)
        except ValueError as exc:
            return JSONResponse(status_code=422, content={"detail": str(exc)})
        log.info("railstub.behaviour_changed", fields=sorted(patch.model_fields_set))
        return stub.behaviour

    @app.post("/admin/reset", dependencies=operators)
    async def reset() -> dict[str, str]:
        """Clear the movement log (its completeness starts again now), restore the start-up
        behaviour and seed, release stalls."""
        state().reset()
        return {"status": "reset"}

    @app.get("/admin/movements", dependencies=readers)
    async def movements(client_reference: str | None = None) -> dict[str, Any]:
        """The evidence: every recorded instruction and the count per client reference."""
        stub = state()
        now = time.time()
        return {
            "movements": [_evidence(stub, m, now) for m in stub.log.snapshot(client_reference)],
            "counts": stub.log.counts(),
            "lookups": stub.log.lookups,
            "complete_from": stub.reported(stub.log.records_since).isoformat(),
        }
