"""The lock server's routes by concern: sessions, the hot grant routes (acquire, renew, release),
inspection and grant history, and the operational ones (/health, /metrics). The break-glass
routes are lockservice.server.breakglass; lockservice.server.app assembles them all.

Must never: let a grant leave the server while the backend is behind the restore watermark
(`_checked_acquire` releases it instead, INV-04), decide lease expiry itself (the backend's clock
does), or put a key, session or token into a metric label (NFR-09).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from common.logs import get_logger
from lockservice import api
from lockservice.api import NotAcquired
from lockservice.server.hotroute import hot_route
from lockservice.server.state import Access, ServerState
from lockservice.server.wire import (
    ERROR_RESPONSES,
    KEY_PATTERN,
    PREFIX_PATTERN,
    AcquireIn,
    GrantBody,
    HistoryOut,
    LockInfoOut,
    OpenSessionIn,
    SessionOut,
    error_response,
    grant_json,
    iso,
    session_json,
)

#: How long /health waits for the backend's answer before it reports it unavailable.
_HEALTH_PROBE_S = 2.0
_log = get_logger("lockservice.server")


async def _checked_acquire(state: ServerState, session_id: str, key: str, wait: float) -> Any:
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


def add_session_routes(app: FastAPI, state: ServerState, access: Access) -> None:
    """Open, keep alive and close the worker's session (its grants end with it)."""
    holder, run = access.holder, state.run

    @app.post(
        "/v1/sessions",
        name="open_session",
        response_model=SessionOut,
        responses=ERROR_RESPONSES,
        dependencies=holder,
    )
    async def open_session(body: OpenSessionIn | None = None) -> Response:
        ttl = api.validate_ttl(
            body.ttl_s if body is not None and body.ttl_s is not None else state.default_ttl_s
        )
        s = await run("open_session", lambda: state.be().open_session(ttl))
        _log.info("lock.session_opened", session_id=s.session_id, ttl_s=s.ttl_s)
        return session_json(s)

    @app.post(
        "/v1/sessions/{session_id}/keepalive",
        name="keepalive",
        response_model=SessionOut,
        responses=ERROR_RESPONSES,
        dependencies=holder,
    )
    async def keepalive(session_id: str) -> Response:
        try:
            s = await run("keepalive", lambda: state.be().keepalive(session_id))
        except api.SessionNotFound:
            _log.warning("lock.session_expired", session_id=session_id)
            raise
        return session_json(s)

    @app.delete(
        "/v1/sessions/{session_id}",
        name="close_session",
        status_code=204,
        responses=ERROR_RESPONSES,
        dependencies=holder,
    )
    async def close_session(session_id: str) -> Response:
        await run("close_session", lambda: state.be().close_session(session_id))
        _log.info("lock.session_closed", session_id=session_id)
        return Response(status_code=204)


def _hot_post(app: FastAPI, access: Access, path: str, **kw: Any) -> Callable[[Any], Any]:
    """`@app.post(path, ...)` for a worker's hot route: the same route, spec and answers, with
    lockservice.server.hotroute's fast path for a well-formed, authorised request."""
    route_class = hot_route(access.holder_dependency, access.holder_check)

    def register(endpoint: Any) -> Any:
        app.router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            responses=ERROR_RESPONSES,
            dependencies=access.holder,
            route_class_override=route_class,
            **kw,
        )
        return endpoint

    return register


def add_grant_routes(app: FastAPI, state: ServerState, access: Access) -> None:
    """Acquire, renew and release: every grant answered is signed (INV-07)."""
    run = state.run

    @_hot_post(app, access, "/v1/locks/acquire", name="acquire", response_model=GrantBody)
    async def acquire(body: AcquireIn) -> Response:
        key, wait = api.validate_key(body.key), api.validate_wait(body.wait_s)
        result = await run("acquire", lambda: _checked_acquire(state, body.session_id, key, wait))
        if isinstance(result, NotAcquired):
            _log.info(
                "lock.not_acquired", key=key, session_id=body.session_id, reason=result.reason
            )
            return error_response(409, "not_acquired", f"{key} not acquired", reason=result.reason)
        return JSONResponse(grant_json(result, state.signer))

    @_hot_post(app, access, "/v1/locks/renew", name="renew", response_model=GrantBody)
    async def renew(body: GrantBody) -> Response:
        grant = body.to_grant()
        api.validate_key(grant.key)
        renewed = await run("renew", lambda: state.be().renew(grant))  # backend: renew_failed
        _log.info("lock.renewed", key=grant.key, token=grant.token)
        return JSONResponse(grant_json(renewed, state.signer))

    @_hot_post(app, access, "/v1/locks/release", name="release", status_code=204)
    async def release(body: GrantBody) -> Response:
        grant = body.to_grant()
        api.validate_key(grant.key)
        try:
            await run("release", lambda: state.be().release(grant))
        except api.NotHeld:
            _log.warning("lock.release_failed", key=grant.key, token=grant.token)
            raise
        return Response(status_code=204)


def add_inspect_routes(app: FastAPI, state: ServerState, access: Access) -> None:
    """Read-only views: one key's state for operators, the grant history for the checker."""
    reader, run = access.reader, state.run

    @app.get(
        "/v1/locks",
        name="inspect",
        response_model=LockInfoOut,
        responses=ERROR_RESPONSES,
        dependencies=reader,
    )
    async def inspect(
        key: str = Query(min_length=1, max_length=api.MAX_KEY_LENGTH, pattern=KEY_PATTERN),
    ) -> Response:
        """A snapshot for operators; never usable for a correctness decision (FR-07)."""
        info = await run("inspect", lambda: state.be().inspect(api.validate_key(key)))
        return JSONResponse(
            {
                "key": info.key,
                "holder_session": info.holder_session,
                "token": info.token,
                "acquired_at": iso(info.acquired_at),
                "expires_at": iso(info.expires_at),
                "waiters": info.waiters,
                "last_token": info.last_token,
            }
        )

    @app.get(
        "/v1/history",
        name="grant_history",
        response_model=HistoryOut,
        responses=ERROR_RESPONSES,
        dependencies=reader,
    )
    async def grant_history(
        prefix: str = Query(default="", max_length=api.MAX_KEY_LENGTH, pattern=PREFIX_PATTERN),
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
                        "acquired_at": iso(r.acquired_at),
                        "ended_at": iso(r.ended_at),
                        "end_reason": r.end_reason,
                    }
                    for r in recs[:limit]
                ],
                "truncated": len(recs) > limit,
                "retained_since": iso(since),
            }
        )


def add_operation_routes(app: FastAPI, state: ServerState) -> None:
    """Health, liveness and metrics: open to anyone who can reach the port (network
    isolation), outside the OpenAPI spec except /health."""

    @app.get("/health", name="health")
    async def health() -> JSONResponse:
        """Whether this server can serve grants: 200 only when its backend answers a read
        (STD01-08). Says nothing about whether a lock is held; never a correctness decision.
        Every answer names the replica that gave it (behind a load balancer)."""
        replica = state.replica_id
        if state.backend is None:
            return JSONResponse({"status": "starting", "replica": replica}, status_code=503)
        try:
            await asyncio.wait_for(state.backend.issuance_position(), timeout=_HEALTH_PROBE_S)
        except (api.LockError, OSError, TimeoutError) as exc:
            why = str(exc)[:200] or type(exc).__name__
            body = {"status": "unavailable", "why": why, "replica": replica}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok", "backend": "reachable", "replica": replica})

    @app.get("/livez", name="livez", include_in_schema=False)
    async def livez() -> dict[str, str]:
        """Liveness of the HTTP process alone (no backend call): the HTTP floor of the lock
        benchmark, and a liveness probe that must not restart a server whose backend is down."""
        return {"status": "ok"}

    @app.get("/metrics", name="metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
