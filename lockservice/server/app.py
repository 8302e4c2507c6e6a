"""The lock server: the `LockBackend` contract over HTTP/JSON (FastAPI), versioned under /v1.

Owns: request validation, the mapping of contract errors to HTTP status codes and JSON bodies
`{"code", "message"}`, the grant/renew/release/expiry events, the Prometheus metrics, and the
Ed25519 signature on every grant it returns (acquire, renew: `kid` + `signature`, INV-07), and
the signed operator assertions it issues to operators and checks on a worker-sent force-revoke
(lockservice.verifiers.assertions).
Events: the backends emit `lock.acquired`, `lock.released`, `lock.renew_failed`, `lock.expired`,
`lock.revoked`, `lock.epoch_bumped` and `alert` (lockservice.server.backends.events); this layer
adds only what they cannot see: `lock.not_acquired`, `lock.renewed`, `lock.session_expired`,
`lock.release_failed`, `lock.session_opened`, `lock.session_closed`,
`lock.operator_assertion_issued`. One event per fact, never two.
Must never: decide lease expiry itself (the backend's clock does), turn bad input into a 500 or a
state change, put a key, session or token into a metric label (NFR-09), return an unsigned grant,
or start (`main`) without its signing key.

Status codes: 200 ok, 204 no body, 400 a body that is not JSON, 404 unknown route or session,
409 not acquired / not held / a bump-epoch refused for the current epoch (`epoch_refused`),
422 invalid input (FastAPI's validation errors reshaped to the same JSON body), 503 backend
unavailable (callers fail closed, FR-27) or `restore_detected`: the backend's data is older than
what this server already issued (lockservice.server.watermark), no grant until `bump-epoch`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from common.correlation import CorrelationMiddleware
from common.credentials import Credentials, load_optional
from common.logs import get_logger
from common.strict_query import reject_unknown_query
from lockservice import api
from lockservice.api import LockBackend, NotAcquired
from lockservice.server.breakglass import add_break_glass_routes
from lockservice.server.hotroute import hot_route
from lockservice.server.signing import GrantSigner
from lockservice.server.state import Access, ServerMetrics, ServerState
from lockservice.server.watermark import Watermark
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
    add_error_shapes,
    error_response,
    grant_json,
    iso,
    session_json,
)
from lockservice.verifiers import DEFAULT_TTL_S

#: How long /health waits for the backend's answer before it reports it unavailable.
_HEALTH_PROBE_S = 2.0
_log = get_logger("lockservice.server")


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
    replica_id: str | None = None,
) -> FastAPI:
    """The HTTP app over an already-connected backend (the caller closes the backend). With a
    `watermark` it refuses grants on restored data; call `await watermark.check(backend)` first
    to detect a restore before the first acquire (app_from_settings does). Without
    `credentials`, authentication is off (every caller is `unauthenticated`): tests only.

    Without `signer`, grants are signed with a fresh in-memory key that no enforcement point
    knows: still never an unsigned grant, but only useful where nobody verifies (lock tests).
    `replica_id` is what /health answers as `replica`; the caller gives the backend the same.
    """
    state = ServerState(
        backend,
        ServerMetrics(),
        default_ttl_s,
        signer or GrantSigner.ephemeral(),
        watermark,
        credentials,
        operator_assertion_ttl_s,
        verify_operator_assertions,
        replica_id,
    )
    return _build(state, lifespan)


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


def _build(state: ServerState, lifespan: Callable[[FastAPI], Any] | None) -> FastAPI:
    """The app: middleware, error shapes, then the route table by concern, in the order the
    OpenAPI spec lists them."""
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
    access = Access.of(state.credentials)
    add_error_shapes(app, state.metrics)
    _add_session_routes(app, state, access)
    _add_grant_routes(app, state, access)
    _add_inspect_routes(app, state, access)
    add_break_glass_routes(app, state, access)
    _add_operation_routes(app, state)
    return app


def _add_session_routes(app: FastAPI, state: ServerState, access: Access) -> None:
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


def _add_grant_routes(app: FastAPI, state: ServerState, access: Access) -> None:
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


def _add_inspect_routes(app: FastAPI, state: ServerState, access: Access) -> None:
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


def _add_operation_routes(app: FastAPI, state: ServerState) -> None:
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


# --------------------------------------------------------------------------- process entry


def app_from_settings(settings: Any) -> FastAPI:
    """The app for `python -m lockservice serve`: connects the backend in the lifespan."""
    from lockservice.server.backends import create_backend

    if not settings.signing_key_path:
        raise ValueError("LOCK_SIGNING_KEY_PATH is required: every grant is signed")
    signer = GrantSigner.from_pem_file(settings.signing_key_path, settings.signing_key_id)
    credentials = load_optional(settings.credentials_path)
    state = ServerState(
        None,
        ServerMetrics(),
        float(settings.default_ttl_s),
        signer,
        None,
        credentials,
        float(settings.operator_assertion_ttl_s),
        bool(settings.verify_operator_assertions),
        str(settings.replica_id),
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
            etcd_tls=settings.etcd_tls(),
            replica_id=state.replica_id,
        )
        if settings.state_dir is None:
            _log.warning("lock.restore_detection_off", why="LOCK_STATE_DIR is not set")
        else:
            state.watermark = _open_watermark(settings)
            # Refusing is remembered (watermark.blocked): every acquire re-checks, and the
            # first one after `bump-epoch` finds the backend ahead again.
            with contextlib.suppress(api.RestoreDetected):
                await state.watermark.check(state.backend)
        # The one event that ties this process's log to its replica id (the audit records and
        # audit events carry it themselves); never a metric label (NFR-09).
        _log.info(
            "lock.server_started",
            backend=settings.backend,
            signing_key_id=signer.kid,
            replica=state.replica_id,
        )
        try:
            yield
        finally:
            backend, state.backend = state.backend, None
            await backend.close()

    return _build(state, lifespan)


def main() -> None:
    """Build the backend from `LOCK_*` settings and serve until SIGINT/SIGTERM."""
    from common.credentials import refuse_without
    from common.exiting import load_settings
    from common.launcher import serve
    from lockservice.server.settings import LockSettings

    settings = load_settings("lock-server", LockSettings)
    # Both files are loaded here first, before logging is configured, for a clean refusal (one
    # line on stderr, exit 2, nothing started); `app_from_settings` loads them again for any
    # other way of serving the app.
    _refuse_without_signer(settings)
    _refuse_bad_state_dir(settings)
    # Safe default: without it every caller could acquire, revoke and bump the epoch.
    refuse_without(settings.credentials_path, "LOCK_CREDENTIALS_PATH", "lock-server")
    # No access log (common.launcher): it would print session ids in paths on every heartbeat.
    serve(
        lambda: app_from_settings(settings),
        service="lock-server",
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        tls=settings.uvicorn_ssl(),
    )


def _open_watermark(settings: Any) -> Watermark:
    """The watermark of the configured backend location, under LOCK_STATE_DIR."""
    from lockservice.server.watermark import location_identity

    identity = location_identity(
        settings.backend, settings.key_prefix, settings.database_url, settings.etcd_endpoint_list()
    )
    return Watermark.open(Path(settings.state_dir), identity)


def _refuse_bad_state_dir(settings: Any) -> None:
    """Exit 2 with one stderr line if LOCK_STATE_DIR is set but its watermark cannot be opened
    (not a directory, not creatable, a watermark file that is not ours or not JSON): found here,
    before the backend is connected, rather than as a failed start-up after it."""
    from common.exiting import refuse

    if settings.state_dir is None:
        return
    try:
        _open_watermark(settings)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        refuse("lock-server", f"LOCK_STATE_DIR {settings.state_dir}: {why}: refusing to start")


def _refuse_without_signer(settings: Any) -> None:
    """Exit 2 with one stderr line unless LOCK_SIGNING_KEY_PATH names a key that loads."""
    from common.exiting import refuse

    if not settings.signing_key_path:
        # Safe default: a lock server that cannot sign would issue grants nobody can verify.
        refuse(
            "lock-server",
            "LOCK_SIGNING_KEY_PATH is not set (the Ed25519 private key, PEM, that signs every "
            "grant): refusing to start",
        )
    try:
        GrantSigner.from_pem_file(settings.signing_key_path, settings.signing_key_id)
    except ValueError as exc:  # unreadable, not a key, or a bad LOCK_SIGNING_KEY_ID
        refuse("lock-server", f"LOCK_SIGNING_KEY_PATH: {exc}: refusing to start")
