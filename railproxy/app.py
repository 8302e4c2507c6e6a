"""HTTP API of the rail proxy (FastAPI app factory)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from common import correlation
from common.credentials import load_optional, require
from common.lockkey import lock_key
from common.logs import get_logger
from common.migrate import migrate
from common.outage import answer_outages
from common.pgutil import create_pool
from common.strict_query import reject_unknown_query
from railproxy import store
from railproxy.errors import (
    InvalidGrant,
    LookupUnavailable,
    Rejected,
    StaleToken,
    StoreUnavailable,
)
from railproxy.metrics import ProxyMetrics
from railproxy.models import (
    IDENT,
    AttemptsResponse,
    ErrorBody,
    HandoffCertainty,
    LookupResponse,
    Outcome,
    SubmitRequest,
    SubmitResponse,
)
from railproxy.resilience import CircuitState
from railproxy.service import RailProxy
from railproxy.settings import ProxySettings
from railproxy.startup import check_start, load_verifier

log = get_logger("railproxy")

#: 400: a body that could not be parsed at all (before validation); the rest: service.py.
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 409, 422, 429, 503, 504)
}
#: Components that read attempts and lookups with their own credential.
_READERS = ("reconciler", "invariants")
_HTTP_CODES = {
    400: "INVALID_REQUEST",
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
}


def _error(status: int, body: ErrorBody) -> JSONResponse:
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"))


def _error_handlers(app: FastAPI) -> None:
    """Every refusal before a handler runs, in the proxy's error shape (NOT_SUBMITTED)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        app.state.metrics.rejections.labels(code="INVALID_REQUEST").inc()
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return _error(
            422,
            ErrorBody(
                code="INVALID_REQUEST",
                message=errors[:1000],
                handoff_certainty=HandoffCertainty.NOT_SUBMITTED,
            ),
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Every other refusal (an unparseable body, an unknown route or method) in the same
        shape as the rest: nothing was forwarded or recorded. 401/403 (common.credentials) are
        answered before any handler: no attempt recorded, nothing forwarded, no fence raised."""
        if exc.status_code in (401, 403):
            app.state.metrics.rejections.labels(code=_HTTP_CODES[exc.status_code]).inc()
        response = _error(
            exc.status_code,
            ErrorBody(
                code=_HTTP_CODES.get(exc.status_code, "HTTP_ERROR"),
                message=str(exc.detail)[:1000],
                handoff_certainty=HandoffCertainty.NOT_SUBMITTED,
            ),
        )
        for name, value in (exc.headers or {}).items():  # a 405 keeps its Allow header
            response.headers[name] = value
        return response

    def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
        """The outage contract (common.outage): a lost, closing or refused database connection
        that a route let escape (a read of attempts) is 503, callers retry; never a 500. Its
        certainty is UNKNOWN: this handler cannot know whether the request forwarded anything
        (every step of a submission maps its own store errors first, with what it knows)."""
        log.warning("railproxy.store_unavailable", path=request.url.path, error=type(exc).__name__)
        return _error(
            503,
            ErrorBody(
                code=StoreUnavailable.code,
                message=f"the proxy's database is unavailable: {type(exc).__name__}",
                handoff_certainty=HandoffCertainty.UNKNOWN,
            ),
        )

    answer_outages(app, store_unavailable)


def create_app(settings: ProxySettings | None = None) -> FastAPI:
    settings = settings or ProxySettings()
    app = FastAPI(
        title="rail proxy",
        version=settings.contract_version,
        lifespan=_lifespan(settings),
        responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}},
        dependencies=[Depends(reject_unknown_query)],
    )
    app.state.metrics = ProxyMetrics()
    # Who may call what: submit only the worker; attempts and lookups also the reconciler, the
    # invariant checker and operators; /health and /metrics open (network isolation). A refused
    # call is answered before the handler: nothing recorded, nothing forwarded, no fence raised.
    credentials = load_optional(settings.credentials_path)  # None: authentication off (tests)
    submitter = [Depends(require(credentials, components=("worker",)))]
    readers = [Depends(require(credentials, operator=True, components=("worker", *_READERS)))]
    app.add_middleware(correlation.CorrelationMiddleware)  # X-Correlation-Id, per request

    def proxy() -> RailProxy:
        p: RailProxy = app.state.proxy
        return p

    _error_handlers(app)
    _submission_routes(app, proxy, submitter)
    _reading_routes(app, proxy, readers)
    _operational_routes(app, proxy)
    return app


def _lifespan(settings: ProxySettings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start-up (the FR-29 check again, the schema, the pool, the Connection's probe loop) and
    shutdown, in reverse."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await check_start(settings)  # FR-29: before anything starts; raises StartupRefused
        await migrate(settings.database_url, schemas={"railproxy"})
        pool = await create_pool(settings.database_url, min_size=1, max_size=settings.db_pool_max)
        proxy = RailProxy(settings, pool, app.state.metrics, load_verifier(settings))
        await proxy.provision()  # the rows of the Connection's shared budget (railproxy.budget)
        app.state.proxy = proxy
        _announce(settings)
        probes = asyncio.create_task(proxy.probe_loop())
        try:
            yield
        finally:
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes
            await proxy.close()
            await pool.close()

    return lifespan


def _submission_routes(app: FastAPI, proxy: Callable[[], RailProxy], submitter: list[Any]) -> None:
    """POST /v1/submissions: the worker's one way to the rail."""

    @app.post(
        "/v1/submissions",
        response_model=SubmitResponse,
        responses={202: {"model": SubmitResponse}, **_ERRORS},
        dependencies=submitter,
    )
    async def submit(req: SubmitRequest) -> Any:
        """Record the attempt (fenced, guarded), forward it once, and report handoff certainty."""
        p = proxy()
        # What prevents a double payout: RailProxy.submit refuses a token below the account's
        # highest (FR-17) and any second attempt of this payout whatever the token (FR-18), and
        # records the attempt before it forwards it (FR-19).
        # The submission's own correlation id (its body) is the one its events and its
        # request to the rail carry, whatever header came with it.
        with correlation.bound(req.context.correlation_id):
            try:
                result = await p.submit(req)
            except Rejected as exc:
                return _rejected(p, req, exc)
        status = 202 if result.outcome is Outcome.UNKNOWN else 200
        return JSONResponse(status_code=status, content=result.model_dump(mode="json"))


def _reading_routes(app: FastAPI, proxy: Callable[[], RailProxy], readers: list[Any]) -> None:
    """The read-only routes: a payout's attempts (recovery) and lookups at the rail."""

    @app.get(
        "/v1/payouts/{payout_id}/attempts",
        response_model=AttemptsResponse,
        responses={422: {"model": ErrorBody}},
        dependencies=readers,
    )
    async def attempts(
        payout_id: Annotated[str, Path(min_length=1, max_length=128, pattern=IDENT)],
    ) -> AttemptsResponse:
        """Every recorded attempt of a payout, oldest first (recovery, FR-24)."""
        return AttemptsResponse(
            payout_id=payout_id, attempts=await store.get_attempts(proxy().pool, payout_id)
        )

    @app.get(
        "/v1/lookup",
        response_model=LookupResponse,
        responses={422: {"model": ErrorBody}, 503: {"model": ErrorBody}},
        dependencies=readers,
    )
    async def lookup(
        client_reference: Annotated[str, Query(min_length=1, max_length=128, pattern=IDENT)],
        payout_id: Annotated[str | None, Query(min_length=1, max_length=128, pattern=IDENT)] = None,
    ) -> Any:
        """Read-only lookup at the rail (bounded retry, jitter); a `not_found` carries the
        proxy's judgement whether it proves the reference's attempts absent (`absent`, `reason`).
        """
        try:
            return await proxy().lookup(client_reference, payout_id)
        except LookupUnavailable as exc:
            return _error(
                503,
                ErrorBody(
                    code=exc.code, message=str(exc), handoff_certainty=HandoffCertainty.UNKNOWN
                ),
            )


def _operational_routes(app: FastAPI, proxy: Callable[[], RailProxy]) -> None:
    """/health and /metrics: open, for probes and Prometheus (network isolation)."""

    @app.get("/health", responses={503: {"description": "the Connection is UNAVAILABLE"}})
    async def health() -> JSONResponse:
        """Normalised operational health of the rail Connection (STD01-08): 200 while it is
        AVAILABLE or DEGRADED, 503 (same body) while it is UNAVAILABLE (circuit not closed)."""
        body = _health(proxy())
        return JSONResponse(body, status_code=503 if body["health_state"] == "UNAVAILABLE" else 200)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _rejected(p: RailProxy, req: SubmitRequest, exc: Rejected) -> JSONResponse:
    p.metrics.rejections.labels(code=exc.code).inc()
    log.warning(
        "rail.rejected",
        replica_id=p.settings.replica_id,
        code=exc.code,
        payout_id=req.payout_id,
        account_id=req.account_id,
        presented_token=req.token,
        highest_token=exc.highest_token,
        correlation_id=req.context.correlation_id,
    )
    if isinstance(exc, InvalidGrant):
        # Nothing was forwarded or recorded, and the high-water mark was not touched.
        log.warning(
            "grant.refused",
            enforcement_point="railproxy",
            reason=exc.reason,
            account_id=req.account_id,
            presented_token=req.token,
        )
    if isinstance(exc, StaleToken):
        log.warning(
            "lock.fenced_out",
            key=lock_key(req.account_id),
            enforcement_point="railproxy",
            presented_token=req.token,
            highest_token=exc.highest_token,
        )
    return _error(
        exc.http_status,
        ErrorBody(
            code=exc.code,
            message=exc.message,
            handoff_certainty=HandoffCertainty.NOT_SUBMITTED,
            presented_token=req.token,
            highest_token=exc.highest_token,
        ),
    )


def _health(p: RailProxy) -> dict[str, Any]:
    now = datetime.now(UTC)
    evidence = p.evidence.summary()
    circuit = p.breaker.state
    admission = "THROTTLED" if p.bucket.throttling else p.bulkhead.state
    if circuit is not CircuitState.CLOSED:
        health_state = "UNAVAILABLE"
    elif (
        admission != "ACCEPTING"
        or (evidence["error_ratio"] or 0) > p.settings.health_degraded_error_ratio
    ):
        # Business declines are answers, not errors (rail.RailAnswer.technical_success); a
        # stray technical failure (a designed 0.5% ambiguity) must not flap the state either.
        health_state = "DEGRADED"
    else:
        health_state = "AVAILABLE"
    return {
        "health_state": health_state,
        "circuit_state": circuit.value,
        "admission_state": admission,
        "in_flight": p.bulkhead.in_flight,
        "queued": p.bulkhead.queued,
        "evidence": evidence,
        "circuit_history": [
            {
                "from": t.from_state.value,
                "to": t.to_state.value,
                "at": t.at.isoformat(),
                "reason": t.reason,
            }
            for t in p.breaker.history
        ],
        "observed_at": now.isoformat(),
        "valid_until": (now + timedelta(seconds=p.settings.health_valid_s)).isoformat(),
        "last_success_at": p.evidence.last_success_at.isoformat()
        if p.evidence.last_success_at
        else None,
        # True only after start-up verified that the rail is the stub (railproxy.startup).
        "experiment_mode": p.settings.experiment_mode,
        "fencing_enforced": p.settings.enforce_fencing,
        "submission_guard_enforced": p.settings.enforce_submission_guard,
        "adapter_version": p.settings.adapter_version,
        "contract_version": p.settings.contract_version,
        "connection_id": p.settings.connection_id,
        "replica_id": p.settings.replica_id,
    }


def _announce(settings: ProxySettings) -> None:
    log.info(
        "railproxy.started",
        replica_id=settings.replica_id,
        connection_id=settings.connection_id,
        rail_url=settings.rail_url,
        adapter_version=settings.adapter_version,
        contract_version=settings.contract_version,
        experiment_mode=settings.experiment_mode,
    )
    if settings.experiment_mode:
        log.warning(
            "experiment_mode.verified",
            enforcement_point="railproxy",
            rail_url=settings.rail_url,
            message="EXPERIMENT MODE: the rail identified itself as the rail stub (FR-29)",
        )
    if not settings.enforce_fencing:
        log.warning(
            "fencing.disabled",
            enforcement_point="railproxy",
            message="EXPERIMENT ONLY: the rail proxy is NOT checking fencing tokens (FR-29)",
        )
    if not settings.verify_grants:
        log.warning(
            "grant_verification.disabled",
            enforcement_point="railproxy",
            message="EXPERIMENT ONLY: the rail proxy accepts tokens nobody signed (INV-07)",
        )
    if not settings.enforce_submission_guard:
        log.warning(
            "submission_guard.disabled",
            enforcement_point="railproxy",
            message="EXPERIMENT ONLY: the rail proxy may forward a payout twice",
        )
