"""The lock server: the `LockBackend` contract over HTTP/JSON (FastAPI), versioned under /v1.

Owns: request validation, the mapping of contract errors to HTTP status codes and JSON bodies
`{"code", "message"}`, the grant/renew/release/expiry events, the Prometheus metrics, and the
Ed25519 signature on every grant it returns (acquire, renew: `kid` + `signature`, INV-07), and
the signed operator assertions it issues to operators and checks on a worker-sent force-revoke
(lockservice.assertions).
Events: the backends emit `lock.acquired`, `lock.released`, `lock.renew_failed`, `lock.expired`,
`lock.revoked`, `lock.epoch_bumped` and `alert` (lockservice.events); this layer adds only what
they cannot see: `lock.not_acquired`, `lock.renewed`, `lock.session_expired`,
`lock.release_failed`, `lock.session_opened`, `lock.session_closed`,
`lock.operator_assertion_issued`. One event per fact, never two.
Must never: decide lease expiry itself (the backend's clock does), turn bad input into a 500 or a
state change, put a key, session or token into a metric label (NFR-09), return an unsigned grant,
or start (`main`) without its signing key.

Status codes: 200 ok, 204 no body, 400 a body that is not JSON, 404 unknown route or session,
409 not acquired / not held / a bump-epoch refused for the current epoch (`epoch_refused`),
422 invalid input (FastAPI's validation errors reshaped to the same JSON body), 503 backend
unavailable (callers fail closed, FR-27) or `restore_detected`: the backend's data is older than
what this server already issued (lockservice.watermark), no grant until `bump-epoch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.correlation import CorrelationMiddleware
from common.credentials import Credentials, Identity, load_optional, require
from common.logs import get_logger
from common.strict_query import reject_unknown_query
from lockservice import api
from lockservice.api import Grant, LockBackend, NotAcquired
from lockservice.assertions import (
    DEFAULT_TTL_S,
    AssertionRefused,
    AssertionVerifier,
    sign_assertion,
)
from lockservice.grants import GrantSigner
from lockservice.watermark import Watermark

T = TypeVar("T")
#: How long /health waits for the backend's answer before it reports it unavailable.
_HEALTH_PROBE_S = 2.0
_log = get_logger("lockservice.server")

_KEY_PATTERN = r"^[A-Za-z0-9:_\-./]+$"
# Tokens are signed 64-bit integers in both backends. The wire bound is 2**63 - 2**10, the
# largest bound a JSON Schema validator comparing as a double reads exactly (2**63 - 1 reads as
# 2**63, so a client trusting the spec would send 2**63 and be refused). The last 1,024 tokens
# of the space would need 2**40 - 1,024 grants of one key in the final epoch: never issued.
_MAX_TOKEN = (1 << 63) - (1 << 10)
_SESSION_ID = Field(min_length=1, max_length=128)
#: Audit text (operator, reason): no control characters (PostgreSQL refuses a NUL in text, and
#: a newline would forge a log line), and at least one character that is not whitespace
#: (api.validate_operator strips it; the control-character range also covers \x1c-\x1f, which
#: Python's str.isspace() counts as whitespace and the regex engine's \s does not).
_NOT_BLANK = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
#: A key prefix: what a key may contain, possibly nothing.
_PREFIX_PATTERN = _KEY_PATTERN.replace("]+$", "]*$")

# --------------------------------------------------------------------------- wire models
# Constraints mirror lockservice.api so that the OpenAPI spec documents them; api's validators
# stay the source of truth and run again in every handler.


class OpenSessionIn(BaseModel):
    ttl_s: float | None = Field(default=None, ge=api.MIN_TTL_S, le=api.MAX_TTL_S)


class SessionOut(BaseModel):
    session_id: str
    ttl_s: float
    expires_at: datetime


class AcquireIn(BaseModel):
    session_id: str = _SESSION_ID
    key: str = Field(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=_KEY_PATTERN)
    wait_s: float = Field(default=0.0, ge=0.0, le=api.MAX_WAIT_S)


class GrantBody(BaseModel):
    key: str = Field(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=_KEY_PATTERN)
    token: int = Field(ge=0, le=_MAX_TOKEN)
    session_id: str = _SESSION_ID
    acquired_at: datetime
    expires_at: datetime

    #: The lock service's signature over the grant (lockservice.grants); ignored on input.
    kid: str | None = None
    signature: str | None = None

    def to_grant(self) -> Grant:
        return Grant(self.key, self.token, self.session_id, self.acquired_at, self.expires_at)


class LockInfoOut(BaseModel):
    key: str
    holder_session: str | None
    token: int | None
    acquired_at: datetime | None
    expires_at: datetime | None
    waiters: int
    last_token: int | None


class GrantRecordOut(BaseModel):
    key: str
    token: int
    session_id: str
    acquired_at: datetime
    ended_at: datetime | None
    end_reason: str | None


class HistoryOut(BaseModel):
    grants: list[GrantRecordOut]
    truncated: bool
    #: grants that ended before it may have been pruned (etcd retention); null: none were
    retained_since: datetime | None = None


class RevokeIn(BaseModel):
    key: str = Field(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=_KEY_PATTERN)
    #: Ignored: the audit names the authenticated operator (common.credentials), never a
    #: free-text name. Accepted so that older clients keep working.
    operator: str | None = Field(default=None, max_length=200, pattern=_NOT_BLANK)
    reason: str = Field(min_length=1, max_length=2000, pattern=_NOT_BLANK)
    #: A worker-sent revoke (the `revoke` signal): the payout the signal was for, and the
    #: operator assertion it carried (lockservice.assertions), verified here.
    payout_id: str | None = Field(default=None, max_length=128)
    assertion: dict[str, Any] | None = None


class AssertionIn(BaseModel):
    action: str = Field(pattern="^(revoke|abandon)$")
    payout_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@:\-]+$")
    reason: str = Field(min_length=1, max_length=2000)
    #: Optional: binds the assertion to one lock key as well as the payout.
    key: str | None = Field(
        default=None, min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=_KEY_PATTERN
    )


class AssertionOut(BaseModel):
    identity: str
    action: str
    payout_id: str
    key: str
    reason: str
    issued_at: datetime
    expires_at: datetime
    nonce: str
    kid: str
    signature: str


class RevokeOut(BaseModel):
    key: str
    revoked_token: int | None
    operator: str
    reason: str
    at: datetime


class BumpEpochIn(BaseModel):
    # Bounded further by the backend: at most api.MAX_EPOCH_STEP above the current epoch.
    min_epoch: int = Field(ge=0, le=api.MAX_EPOCH)
    #: Ignored, as in RevokeIn: the authenticated operator is audited.
    operator: str | None = Field(default=None, max_length=200, pattern=_NOT_BLANK)
    reason: str = Field(min_length=1, max_length=2000, pattern=_NOT_BLANK)


class BumpEpochOut(BaseModel):
    epoch: int


class ErrorBody(BaseModel):
    code: str
    message: str
    reason: str | None = None  # only for not_acquired: "held" or "timeout"


#: Every status a /v1 route can answer besides its success: 400 a body that is not JSON at all
#: (Starlette's parser, before validation), 401/403 (common.credentials), 404, 409, 422, 503
#: as above.
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (400, 401, 403, 404, 409, 422, 503)
}

#: Who may call what (docs/architecture.md, Trust).
#: The worker holds grants; the invariant checker reads the
#: grant history; inspect is for operators (and the checker); force-revoke and bump-epoch are
#: break-glass: operators only. /health, /livez and /metrics stay open (network isolation).
WORKER = "worker"
READERS = ("worker", "invariants", "reconciler")

# --------------------------------------------------------------------------- plumbing


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat()


def _grant_json(g: Grant, signer: GrantSigner) -> dict[str, Any]:
    signed = signer.sign(g)  # every grant that leaves this server is signed (INV-07)
    return {
        "key": g.key,
        "token": g.token,
        "session_id": g.session_id,
        "acquired_at": _iso(g.acquired_at),
        "expires_at": _iso(g.expires_at),
        "kid": signed.kid,
        "signature": signed.signature,
    }


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **extra}, status_code=status)


_STATUS_OF: dict[type[api.LockError], int] = {  # first match wins: subclasses first
    api.EpochRefused: 409,
    api.InvalidRequest: 422,
    api.SessionNotFound: 404,
    api.NotHeld: 409,
    api.BackendUnavailable: 503,
}


def _status_of(exc: api.LockError) -> int:
    for cls, status in _STATUS_OF.items():
        if isinstance(exc, cls):
            return status
    return 500


class _Metrics:
    """Per-app registry, so that several apps in one process (tests, bench) never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "lock_requests",
            "Lock-server requests by operation and outcome.",
            ["op", "outcome"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "lock_request_seconds",
            "Lock-server request handling time by operation.",
            ["op"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
        )


@dataclass
class _State:
    backend: LockBackend | None
    metrics: _Metrics
    default_ttl_s: float
    signer: GrantSigner
    #: Restored-data detection (lockservice.watermark); None: off (no LOCK_STATE_DIR).
    watermark: Watermark | None = None
    #: Accepted bearer tokens (common.credentials); None: authentication off (tests only;
    #: `main` refuses to start without LOCK_CREDENTIALS_PATH).
    credentials: Credentials | None = None
    #: Lifetime of the operator assertions this server issues (lockservice.assertions).
    assertion_ttl_s: float = DEFAULT_TTL_S
    #: Off (experiment switch): a worker-sent force-revoke needs no operator assertion.
    verify_assertions: bool = True

    def assertion_verifier(self) -> AssertionVerifier:
        # This server's own public key: it checks what it signed, by its own clock.
        return AssertionVerifier({self.signer.kid: self.signer.public_key()})

    def be(self) -> LockBackend:
        if self.backend is None:  # only between process start and the end of lifespan start-up
            raise api.BackendUnavailable("lock backend not connected yet")
        return self.backend


_OUTCOME_OF: dict[type[Exception], str] = {
    api.InvalidRequest: "invalid",
    api.SessionNotFound: "session_not_found",
    api.NotHeld: "not_held",
    api.BackendUnavailable: "unavailable",
}


def _op_of(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "name", None) or "unknown")


# --------------------------------------------------------------------------- the app


def create_app(
    backend: LockBackend,
    *,
    default_ttl_s: float = 15.0,
    lifespan: Callable[[FastAPI], Any] | None = None,
    watermark: Watermark | None = None,
    signer: GrantSigner | None = None,
    credentials: Credentials | None = None,
    operator_assertion_ttl_s: float = DEFAULT_TTL_S,
    verify_operator_assertions: bool = True,
) -> FastAPI:
    """The HTTP app over an already-connected backend (the caller closes the backend). With a
    `watermark` it refuses grants on restored data; call `await watermark.check(backend)` first
    to detect a restore before the first acquire (app_from_settings does). Without
    `credentials`, authentication is off (every caller is `unauthenticated`): tests only.

    Without `signer`, grants are signed with a fresh in-memory key that no enforcement point
    knows: still never an unsigned grant, but only useful where nobody verifies (lock tests).
    """
    state = _State(
        backend,
        _Metrics(),
        default_ttl_s,
        signer or GrantSigner.ephemeral(),
        watermark,
        credentials,
        operator_assertion_ttl_s,
        verify_operator_assertions,
    )
    return _build(state, lifespan)


async def _checked_acquire(state: _State, session_id: str, key: str, wait: float) -> Any:
    """acquire, refusing (RestoreDetected, 503) while the backend is behind the watermark.

    A token reissued from restored data could equal one still in flight, which both enforcement
    points accept (T >= fence): so the grant is checked after the backend committed it and
    before it leaves this process, and a refused grant is released, never answered."""
    be, wm = state.be(), state.watermark
    if wm is not None and wm.blocked:
        await wm.check(be)  # raises until an epoch bump moved the backend above the watermark
    floor = None if wm is None else wm.mark  # before the grant: it must end up strictly above
    result = await be.acquire(session_id, key, wait)
    if wm is None or isinstance(result, NotAcquired):
        return result
    try:
        await wm.after_grant(be, result.token, floor)
    except api.RestoreDetected:
        with contextlib.suppress(api.LockError, OSError, TimeoutError):
            await be.release(result)
        raise
    return result


def _build(  # noqa: PLR0915 - one route table, read top to bottom
    state: _State, lifespan: Callable[[FastAPI], Any] | None
) -> FastAPI:
    app = FastAPI(
        title="lockservice",
        version="1",
        description=__doc__,
        lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query)],  # a misspelt parameter is a 422
    )
    app.state.lock = state
    # Binds the caller's X-Correlation-Id for the request: every event below carries it.
    app.add_middleware(CorrelationMiddleware)
    m = state.metrics
    holder = [Depends(require(state.credentials, components=(WORKER,)))]
    reader = [Depends(require(state.credentials, operator=True, components=READERS))]
    operator_only = Depends(require(state.credentials, operator=True))
    # Force-revoke also from the worker: the `payouts payout revoke` signal reaches the lock
    # server through the worker's revoke activity. A signal is not authenticated (anyone who can
    # reach Temporal can send one), so the worker's revoke is carried out only with the operator
    # assertion this server signed for that payout and action (lockservice.assertions), and the
    # identity inside it is audited.
    revoker = Depends(require(state.credentials, operator=True, components=(WORKER,)))

    async def run(op: str, call: Callable[[], Awaitable[T]]) -> T:
        """Time and count one backend call; errors propagate to the exception handlers."""
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await call()
        except api.LockError as exc:
            outcome = next((o for c, o in _OUTCOME_OF.items() if isinstance(exc, c)), "error")
            raise
        except (OSError, TimeoutError):
            outcome = "unavailable"
            raise
        except Exception:
            outcome = "error"
            raise
        finally:
            m.seconds.labels(op).observe(time.perf_counter() - started)
            m.requests.labels(op, outcome).inc()

    # ------------------------------------------------------------------ error shapes

    @app.exception_handler(api.LockError)
    async def _lock_error(request: Request, exc: api.LockError) -> JSONResponse:
        return _error(_status_of(exc), exc.code, str(exc) or exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        m.requests.labels(_op_of(request), "invalid").inc()
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
        return _error(422, api.InvalidRequest.code, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {
            401: "unauthorized",
            403: "forbidden",
            404: "not_found",
            405: "method_not_allowed",
        }.get(exc.status_code, "http_error")
        response = _error(exc.status_code, code, str(exc.detail))
        # Keep the exception's headers: a 405 must say which methods are allowed (RFC 9110).
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(OSError)
    @app.exception_handler(TimeoutError)
    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        # A backend driver error that escaped the backend's own mapping: still fail closed.
        _log.warning("lock.backend_error", op=_op_of(request), error=type(exc).__name__)
        return _error(503, api.BackendUnavailable.code, "lock backend unavailable")

    # ------------------------------------------------------------------ sessions

    @app.post(
        "/v1/sessions",
        name="open_session",
        response_model=SessionOut,
        responses=_ERRORS,
        dependencies=holder,
    )
    async def open_session(body: OpenSessionIn | None = None) -> Response:
        ttl = api.validate_ttl(
            body.ttl_s if body is not None and body.ttl_s is not None else state.default_ttl_s
        )
        s = await run("open_session", lambda: state.be().open_session(ttl))
        _log.info("lock.session_opened", session_id=s.session_id, ttl_s=s.ttl_s)
        return JSONResponse(
            {"session_id": s.session_id, "ttl_s": s.ttl_s, "expires_at": _iso(s.expires_at)}
        )

    @app.post(
        "/v1/sessions/{session_id}/keepalive",
        name="keepalive",
        response_model=SessionOut,
        responses=_ERRORS,
        dependencies=holder,
    )
    async def keepalive(session_id: str) -> Response:
        try:
            s = await run("keepalive", lambda: state.be().keepalive(session_id))
        except api.SessionNotFound:
            _log.warning("lock.session_expired", session_id=session_id)
            raise
        return JSONResponse(
            {"session_id": s.session_id, "ttl_s": s.ttl_s, "expires_at": _iso(s.expires_at)}
        )

    @app.delete(
        "/v1/sessions/{session_id}",
        name="close_session",
        status_code=204,
        responses=_ERRORS,
        dependencies=holder,
    )
    async def close_session(session_id: str) -> Response:
        await run("close_session", lambda: state.be().close_session(session_id))
        _log.info("lock.session_closed", session_id=session_id)
        return Response(status_code=204)

    # ------------------------------------------------------------------ locks

    @app.post(
        "/v1/locks/acquire",
        name="acquire",
        response_model=GrantBody,
        responses=_ERRORS,
        dependencies=holder,
    )
    async def acquire(body: AcquireIn) -> Response:
        key, wait = api.validate_key(body.key), api.validate_wait(body.wait_s)
        result = await run("acquire", lambda: _checked_acquire(state, body.session_id, key, wait))
        if isinstance(result, NotAcquired):
            _log.info(
                "lock.not_acquired", key=key, session_id=body.session_id, reason=result.reason
            )
            return _error(409, "not_acquired", f"{key} not acquired", reason=result.reason)
        return JSONResponse(_grant_json(result, state.signer))

    @app.post(
        "/v1/locks/renew",
        name="renew",
        response_model=GrantBody,
        responses=_ERRORS,
        dependencies=holder,
    )
    async def renew(body: GrantBody) -> Response:
        grant = body.to_grant()
        api.validate_key(grant.key)
        renewed = await run("renew", lambda: state.be().renew(grant))  # backend: renew_failed
        _log.info("lock.renewed", key=grant.key, token=grant.token)
        return JSONResponse(_grant_json(renewed, state.signer))

    @app.post(
        "/v1/locks/release", name="release", status_code=204, responses=_ERRORS, dependencies=holder
    )
    async def release(body: GrantBody) -> Response:
        grant = body.to_grant()
        api.validate_key(grant.key)
        try:
            await run("release", lambda: state.be().release(grant))
        except api.NotHeld:
            _log.warning("lock.release_failed", key=grant.key, token=grant.token)
            raise
        return Response(status_code=204)

    @app.get(
        "/v1/locks",
        name="inspect",
        response_model=LockInfoOut,
        responses=_ERRORS,
        dependencies=reader,
    )
    async def inspect(
        key: str = Query(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=_KEY_PATTERN),
    ) -> Response:
        """A snapshot for operators; never usable for a correctness decision (FR-07)."""
        info = await run("inspect", lambda: state.be().inspect(api.validate_key(key)))
        return JSONResponse(
            {
                "key": info.key,
                "holder_session": info.holder_session,
                "token": info.token,
                "acquired_at": _iso(info.acquired_at),
                "expires_at": _iso(info.expires_at),
                "waiters": info.waiters,
                "last_token": info.last_token,
            }
        )

    @app.get(
        "/v1/history",
        name="grant_history",
        response_model=HistoryOut,
        responses=_ERRORS,
        dependencies=reader,
    )
    async def grant_history(
        prefix: str = Query(default="", max_length=api.MAX_KEY_LENGTH, pattern=_PREFIX_PATTERN),
        limit: int = Query(default=api.DEFAULT_HISTORY_LIMIT, ge=0, le=api.MAX_HISTORY_LIMIT),
    ) -> Response:
        """Every grant issued for keys starting with `prefix`, ordered by (key, token), at most
        `limit` of them (for the invariant checker, INV-04/INV-06). `truncated` says more exist."""
        recs = await run("grant_history", lambda: state.be().grant_history(prefix, limit=limit + 1))
        # Read after the history: retention raises the horizon BEFORE it deletes, so this covers
        # every grant missing from `recs` (invariants.checker skips writes before it for INV-07).
        since = await run("grant_history", lambda: state.be().history_retained_since())
        return JSONResponse(
            {
                "grants": [
                    {
                        "key": r.key,
                        "token": r.token,
                        "session_id": r.session_id,
                        "acquired_at": _iso(r.acquired_at),
                        "ended_at": _iso(r.ended_at),
                        "end_reason": r.end_reason,
                    }
                    for r in recs[:limit]
                ],
                "truncated": len(recs) > limit,
                "retained_since": _iso(since),
            }
        )

    @app.post("/v1/locks/revoke", name="force_revoke", response_model=RevokeOut, responses=_ERRORS)
    async def force_revoke(body: RevokeIn, who: Identity = revoker) -> Response:
        """Break-glass: ends the current grant and advances the token (FR-08). The backend emits
        the `lock.revoked` audit event and the `alert` event, naming the authenticated operator
        (the body's `operator` is ignored)."""
        key = api.validate_key(body.key)
        actor, reason = who.name, body.reason
        if who.kind == "component":
            refused, actor, reason = _asserted_revoke(state, body, key)
            if refused is not None:
                return refused
        operator, reason = api.validate_operator(actor, reason)
        r = await run("force_revoke", lambda: state.be().force_revoke(key, operator, reason))
        return JSONResponse(
            {
                "key": r.key,
                "revoked_token": r.revoked_token,
                "operator": r.operator,
                "reason": r.reason,
                "at": _iso(r.at),
            }
        )

    @app.post(
        "/v1/operator-assertions",
        name="issue_operator_assertion",
        response_model=AssertionOut,
        responses=_ERRORS,
    )
    async def issue_operator_assertion(
        body: AssertionIn, who: Identity = operator_only
    ) -> Response:
        """Operators only: a short-lived signed statement that the authenticated operator asks
        for `action` on `payout_id`, for `payouts payout revoke|abandon` to carry in its
        Temporal signal (no secret travels in Temporal history). Changes nothing here."""
        now = datetime.now(UTC)
        try:
            a = sign_assertion(
                state.signer,
                identity=who.name,
                action=body.action,
                payout_id=body.payout_id,
                reason=body.reason,
                issued_at=now,
                expires_at=now + timedelta(seconds=state.assertion_ttl_s),
                nonce=secrets.token_urlsafe(16),
                key=body.key or "",
            )
        except ValueError as exc:  # e.g. a blank reason: bad input, a 422, nothing signed
            raise api.InvalidRequest(str(exc)) from None
        _log.info(
            "lock.operator_assertion_issued",
            operator=a.identity,
            action=a.action,
            payout_id=a.payout_id,
            expires_at=a.expires_at.isoformat(),
            kid=a.kid,
        )
        return JSONResponse(a.to_json())

    @app.post("/v1/epoch/bump", name="bump_epoch", response_model=BumpEpochOut, responses=_ERRORS)
    async def bump_epoch(body: BumpEpochIn, who: Identity = operator_only) -> Response:
        """Restore procedure: every key's next token moves above anything issued before.
        Operators only; the authenticated operator is audited."""
        operator, reason = api.validate_operator(who.name, body.reason)
        epoch = await run(
            "bump_epoch", lambda: state.be().bump_epoch(body.min_epoch, operator, reason)
        )
        return JSONResponse({"epoch": epoch})

    # ------------------------------------------------------------------ operations

    @app.get("/health", name="health")
    async def health() -> JSONResponse:
        """Whether this server can serve grants: 200 only when its backend answers a read
        (STD01-08). Says nothing about whether a lock is held; never a correctness decision."""
        if state.backend is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            await asyncio.wait_for(state.backend.issuance_position(), timeout=_HEALTH_PROBE_S)
        except (api.LockError, OSError, TimeoutError) as exc:
            why = str(exc)[:200] or type(exc).__name__
            return JSONResponse({"status": "unavailable", "why": why}, status_code=503)
        return JSONResponse({"status": "ok", "backend": "reachable"})

    @app.get("/livez", name="livez", include_in_schema=False)
    async def livez() -> dict[str, str]:
        """Liveness of the HTTP process alone (no backend call): the HTTP floor of the lock
        benchmark, and a liveness probe that must not restart a server whose backend is down."""
        return {"status": "ok"}

    @app.get("/metrics", name="metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _asserted_revoke(
    state: _State, body: RevokeIn, key: str
) -> tuple[JSONResponse | None, str, str]:
    """A worker-sent revoke: (refusal, actor, reason). With verification on, the actor and
    reason are those of the operator assertion, checked for action `revoke`, the payout the
    worker names and (if the assertion names one) this key, by this server's clock; a refusal
    is a 403 and nothing is revoked. Off (experiment switch): the free-text name, marked."""
    if not state.verify_assertions:
        return None, f"worker/unverified:{(body.operator or 'unknown')[:100]}", body.reason
    try:
        a = state.assertion_verifier().verify(
            body.assertion, action="revoke", payout_id=body.payout_id or "", key=key
        )
    except AssertionRefused as exc:
        refusal = _error(403, f"operator_assertion_{exc.code}", str(exc)[:300])
        return refusal, "", ""
    return None, a.identity, a.reason


# --------------------------------------------------------------------------- process entry


def app_from_settings(settings: Any) -> FastAPI:
    """The app for `python -m lockservice serve`: connects the backend in the lifespan."""
    from lockservice.backends import create_backend
    from lockservice.watermark import location_identity

    if not settings.signing_key_path:
        raise ValueError("LOCK_SIGNING_KEY_PATH is required: every grant is signed")
    signer = GrantSigner.from_pem_file(settings.signing_key_path, settings.signing_key_id)
    credentials = load_optional(settings.credentials_path)
    state = _State(
        None,
        _Metrics(),
        float(settings.default_ttl_s),
        signer,
        None,
        credentials,
        float(settings.operator_assertion_ttl_s),
        bool(settings.verify_operator_assertions),
    )
    if not state.verify_assertions:
        _log.warning(
            "lock.operator_assertions_unverified",
            why="LOCK_VERIFY_OPERATOR_ASSERTIONS=false: a worker-sent revoke is carried out on "
            "the signal's free-text name (experiment only)",
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.backend = await create_backend(
            settings.backend,
            database_url=settings.database_url,
            etcd_endpoints=settings.etcd_endpoint_list() or None,
            prefix=settings.key_prefix,
            etcd_history_retention_s=settings.etcd_history_retention_s,
            etcd_compact_every_s=settings.etcd_compact_every_s,
        )
        if settings.state_dir is None:
            _log.warning("lock.restore_detection_off", why="LOCK_STATE_DIR is not set")
        else:
            state.watermark = Watermark.open(
                Path(settings.state_dir),
                location_identity(
                    settings.backend,
                    settings.key_prefix,
                    settings.database_url,
                    settings.etcd_endpoint_list(),
                ),
            )
            # Refusing is remembered (watermark.blocked): every acquire re-checks, and the
            # first one after `bump-epoch` finds the backend ahead again.
            with contextlib.suppress(api.RestoreDetected):
                await state.watermark.check(state.backend)
        _log.info("lock.server_started", backend=settings.backend, signing_key_id=signer.kid)
        try:
            yield
        finally:
            backend, state.backend = state.backend, None
            await backend.close()

    return _build(state, lifespan)


def main() -> None:
    """Build the backend from `LOCK_*` settings and serve until SIGINT/SIGTERM."""
    import sys

    import uvicorn

    from common.logs import configure_logging
    from lockservice.settings import LockSettings

    settings = LockSettings()
    if not settings.signing_key_path:
        # Safe default: a lock server that cannot sign would issue grants nobody can verify.
        print(  # noqa: T201 - the one-line refusal on stderr, before logging exists
            "lock-server: LOCK_SIGNING_KEY_PATH is not set (the Ed25519 private key, PEM, that "
            "signs every grant): refusing to start",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if not settings.credentials_path:
        # Safe default: without it every caller could acquire, revoke and bump the epoch.
        print(  # noqa: T201 - the one-line refusal on stderr, before logging exists
            "lock-server: LOCK_CREDENTIALS_PATH is not set (the accepted bearer-token digests, "
            "common.credentials): refusing to start",
            file=sys.stderr,
        )
        raise SystemExit(2)
    configure_logging("lock-server", level=settings.log_level)
    # The access log would print session ids in paths on every heartbeat; events cover requests.
    uvicorn.run(
        app_from_settings(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
    )
