"""Stable structlog event names of the lock backends, and the helpers both backends call.

Both backends emit the same events with the same fields so that alerts and the invariant checker
never need to know which backend ran (FR-09, NFR-08). Alerts filter on these names, never on text.
"""

from __future__ import annotations

from typing import Any

import structlog

LOCK_ACQUIRED = "lock.acquired"
LOCK_RELEASED = "lock.released"
LOCK_RENEW_FAILED = "lock.renew_failed"
LOCK_EXPIRED = "lock.expired"
LOCK_REVOKED = "lock.revoked"
LOCK_EPOCH_BUMPED = "lock.epoch_bumped"
#: etcd retention and compaction (lockservice.server.backends.etcd_retention)
LOCK_ETCD_HISTORY_PRUNED = "lock.etcd_history_pruned"
LOCK_ETCD_COMPACTED = "lock.etcd_compacted"
LOCK_ETCD_MAINTENANCE_FAILED = "lock.etcd_maintenance_failed"
ALERT = "alert"
ALERT_FORCE_REVOKED = "lock_force_revoked"
ALERT_EPOCH_BUMPED = "lock_epoch_bumped"


def _log() -> Any:
    # Looked up per call rather than cached at import, so structlog.testing.capture_logs() works.
    return structlog.get_logger("lockservice.backend")


def acquired(backend: str, key: str, token: int, session_id: str) -> None:
    """One line per grant: the etcd backend's grant history lives in these events."""
    _log().info(LOCK_ACQUIRED, backend=backend, key=key, token=token, session_id=session_id)


def released(backend: str, key: str, token: int, session_id: str) -> None:
    _log().info(LOCK_RELEASED, backend=backend, key=key, token=token, session_id=session_id)


def renew_failed(backend: str, key: str, token: int, session_id: str) -> None:
    _log().warning(LOCK_RENEW_FAILED, backend=backend, key=key, token=token, session_id=session_id)


def expired(backend: str, key: str, token: int, session_id: str) -> None:
    _log().info(LOCK_EXPIRED, backend=backend, key=key, token=token, session_id=session_id)


def revoked(
    backend: str,
    key: str,
    revoked_token: int | None,
    operator: str,
    reason: str,
    *,
    replica: str | None = None,
) -> None:
    """UC-06: the audit event and the alert of a force-revoke (FR-08). `replica`: the lock
    server that carried it out, as in the backend's audit record."""
    log = _log()
    log.warning(
        LOCK_REVOKED,
        backend=backend,
        key=key,
        revoked_token=revoked_token,
        operator=operator,
        reason=reason,
        replica=replica,
    )
    log.warning(ALERT, name=ALERT_FORCE_REVOKED, key=key, operator=operator, reason=reason)


def epoch_bumped(
    backend: str,
    old_epoch: int,
    new_epoch: int,
    operator: str,
    reason: str,
    *,
    highest_fence_seen: int | None = None,
    replica: str | None = None,
) -> None:
    """The audit event and the alert of an epoch bump; `replica` as in `revoked`."""
    log = _log()
    log.warning(
        LOCK_EPOCH_BUMPED,
        backend=backend,
        old_epoch=old_epoch,
        new_epoch=new_epoch,
        operator=operator,
        reason=reason,
        highest_fence_seen=highest_fence_seen,
        replica=replica,
    )
    log.warning(ALERT, name=ALERT_EPOCH_BUMPED, operator=operator, reason=reason)
