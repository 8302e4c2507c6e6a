"""The lock server's wire format: the JSON bodies of its /v1 routes and of every error.

The pydantic models document the bounds of lockservice.api in the OpenAPI spec (api's validators
stay the source of truth and run again in every handler); the helpers shape what goes out: grants
(always signed, INV-07), sessions, and the error body `{"code", "message"}` with the status of each
contract error (the status table is in lockservice.server.app's docstring, which is also the spec's
description).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.logs import get_logger
from common.outage import answer_outages
from lockservice import api
from lockservice.api import Grant, Session
from lockservice.server.signing import GrantSigner
from lockservice.server.state import ServerMetrics, op_of

_log = get_logger("lockservice.server")

KEY_PATTERN = r"^[A-Za-z0-9:_\-./]+$"
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
PREFIX_PATTERN = KEY_PATTERN.replace("]+$", "]*$")


class OpenSessionIn(BaseModel):
    ttl_s: float | None = Field(default=None, ge=api.MIN_TTL_S, le=api.MAX_TTL_S)


class SessionOut(BaseModel):
    session_id: str
    ttl_s: float
    expires_at: datetime


class AcquireIn(BaseModel):
    session_id: str = _SESSION_ID
    key: str = Field(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=KEY_PATTERN)
    wait_s: float = Field(default=0.0, ge=0.0, le=api.MAX_WAIT_S)


class GrantBody(BaseModel):
    key: str = Field(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=KEY_PATTERN)
    token: int = Field(ge=0, le=_MAX_TOKEN)
    session_id: str = _SESSION_ID
    acquired_at: datetime
    expires_at: datetime

    #: The lock service's signature over the grant (lockservice.verifiers.grants); ignored on input.
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
    key: str = Field(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=KEY_PATTERN)
    #: Ignored: the audit names the authenticated operator (common.credentials), never a
    #: free-text name. Accepted so that older clients keep working.
    operator: str | None = Field(default=None, max_length=200, pattern=_NOT_BLANK)
    reason: str = Field(min_length=1, max_length=2000, pattern=_NOT_BLANK)
    #: A worker-sent revoke (the `revoke` signal): the payout the signal was for, and the
    #: operator assertion it carried (lockservice.verifiers.assertions), verified here.
    payout_id: str | None = Field(default=None, max_length=128)
    assertion: dict[str, Any] | None = None


class AssertionIn(BaseModel):
    action: str = Field(pattern="^(revoke|abandon)$")
    payout_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@:\-]+$")
    reason: str = Field(min_length=1, max_length=2000)
    #: Binds the assertion to one lock key as well as the payout: required for `revoke` (the lock
    #: key of the payout's account; the lock server refuses a revoke assertion without one),
    #: optional for `abandon`.
    key: str | None = Field(
        default=None, min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=KEY_PATTERN
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
#: as lockservice.server.app's docstring says.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (400, 401, 403, 404, 409, 422, 503)
}


def iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat()


def grant_json(g: Grant, signer: GrantSigner) -> dict[str, Any]:
    signed = signer.sign(g)  # every grant that leaves this server is signed (INV-07)
    return {
        "key": g.key,
        "token": g.token,
        "session_id": g.session_id,
        "acquired_at": iso(g.acquired_at),
        "expires_at": iso(g.expires_at),
        "kid": signed.kid,
        "signature": signed.signature,
    }


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
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


def add_error_shapes(app: FastAPI, m: ServerMetrics) -> None:
    """Every error as the JSON body `{"code", "message"}` with the status of the module doc."""

    @app.exception_handler(api.LockError)
    async def _lock_error(request: Request, exc: api.LockError) -> JSONResponse:
        return error_response(_status_of(exc), exc.code, str(exc) or exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        m.requests.labels(op_of(request), "invalid").inc()
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
        return error_response(422, api.InvalidRequest.code, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {
            401: "unauthorized",
            403: "forbidden",
            404: "not_found",
            405: "method_not_allowed",
        }.get(exc.status_code, "http_error")
        response = error_response(exc.status_code, code, str(exc.detail))
        # Keep the exception's headers: a 405 must say which methods are allowed (RFC 9110).
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    def _unavailable(request: Request, exc: Exception) -> Response:
        # A backend driver error that escaped the backend's own mapping: still fail closed.
        _log.warning("lock.backend_error", op=op_of(request), error=type(exc).__name__)
        return error_response(503, api.BackendUnavailable.code, "lock backend unavailable")

    answer_outages(app, _unavailable)


def session_json(s: Session) -> JSONResponse:
    return JSONResponse(
        {"session_id": s.session_id, "ttl_s": s.ttl_s, "expires_at": iso(s.expires_at)}
    )
