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

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI

from common.correlation import CorrelationMiddleware
from common.credentials import Credentials, load_optional
from common.logs import get_logger
from common.strict_query import reject_unknown_query
from lockservice import api
from lockservice.api import LockBackend
from lockservice.server.breakglass import add_break_glass_routes
from lockservice.server.routes import (
    add_grant_routes,
    add_inspect_routes,
    add_operation_routes,
    add_session_routes,
)
from lockservice.server.signing import GrantSigner
from lockservice.server.state import Access, ServerMetrics, ServerState
from lockservice.server.watermark import Watermark
from lockservice.server.wire import (
    add_error_shapes,
)
from lockservice.verifiers import DEFAULT_TTL_S

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
    add_session_routes(app, state, access)
    add_grant_routes(app, state, access)
    add_inspect_routes(app, state, access)
    add_break_glass_routes(app, state, access)
    add_operation_routes(app, state)
    return app


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
