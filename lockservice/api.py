"""The lock contract, shared by both backends, the HTTP server and the client SDK.

Standard library only (NFR-16): a test fails if this module imports anything else.

Semantics (identical for the PostgreSQL and the etcd backend):

* A client opens one **session** with a TTL and keeps it alive by heartbeat (`keepalive`). A
  session that is not kept alive expires on the backend's clock and every lock attached to it is
  released (FR-03, FR-04). The backend's clock decides expiry, never the client's.
* `acquire(session, key, wait)` returns a `Grant` or `NotAcquired` within the wait budget. At most
  one valid grant per key exists at any instant (FR-01, INV-06).
* A grant's `token` is strictly increasing per key over the service's whole life, including
  backend restart, force-revoke and restore from backup (FR-02, INV-04). The token is
  `epoch * TOKEN_EPOCH_STRIDE + base`, where `base` is a per-key counter (PostgreSQL) or the key's
  ModRevision (etcd, FR-10) and `epoch` is 0 until a restore procedure bumps it.
* `renew(grant)` extends only a still-valid grant and raises `NotHeld` otherwise (FR-06).
* `release(grant)` is a compare-and-delete on the caller's own grant (session and token); there is
  no way to name another holder's lock (FR-05). Releasing a grant that is no longer valid raises
  `NotHeld`.
* `inspect(key)` reports holder, token, times and waiter count. It is a snapshot for operators and
  dashboards and is NEVER usable for a correctness decision: by the time you read it, it may be
  false. Correctness comes only from fencing tokens checked by the resources (FR-07).
* `force_revoke(key, operator, reason)` requires both, ends the current grant, guarantees that the
  next token is higher than every token before, and emits an audit event and an alert (FR-08).

The fencing rule at the resources (documented in the README): a write presenting token T succeeds
only if T >= the stored fence, and stamps fence = T in the same statement. Equality is accepted
because tokens are unique per key: an equal token is the same grant taking its next step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

#: Tokens are `epoch * TOKEN_EPOCH_STRIDE + base`; base (counter or ModRevision) stays below it.
TOKEN_EPOCH_STRIDE = 1 << 40
MAX_KEY_LENGTH = 256
MIN_TTL_S = 1.0
MAX_TTL_S = 3600.0
MAX_WAIT_S = 300.0
_KEY_RE = re.compile(r"^[A-Za-z0-9:_\-./]+$")


# --------------------------------------------------------------------------- errors
#
# LockError
#  +-- InvalidRequest          bad key, TTL, wait budget, missing operator or reason
#  +-- SessionNotFound         unknown or already expired/closed session
#  +-- NotHeld                 renew/release of a grant that is no longer valid
#  +-- BackendUnavailable      the backend cannot be reached; callers fail closed (FR-27)


class LockError(Exception):
    """Base class of every lock-service error. `code` is a stable machine-readable name."""

    code = "lock_error"


class InvalidRequest(LockError):
    code = "invalid_request"


class SessionNotFound(LockError):
    code = "session_not_found"


class NotHeld(LockError):
    """The grant presented is not (or no longer) the valid grant of its key."""

    code = "not_held"


class BackendUnavailable(LockError):
    code = "backend_unavailable"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    ttl_s: float
    expires_at: datetime  # the backend's view; informational for clients


@dataclass(frozen=True, slots=True)
class Grant:
    key: str
    token: int
    session_id: str
    acquired_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class NotAcquired:
    key: str
    reason: Literal["held", "timeout"]  # "held": wait budget 0 and someone holds it


@dataclass(frozen=True, slots=True)
class LockInfo:
    """A snapshot for operators. Never use it for a correctness decision (FR-07)."""

    key: str
    holder_session: str | None
    token: int | None
    acquired_at: datetime | None
    expires_at: datetime | None
    waiters: int
    last_token: int | None  # the highest token ever issued for the key


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """One grant ever issued, from the backend's durable history (for the invariant checker).

    `ended_at`/`end_reason` are None while the grant is still valid, and also when its end was not
    recorded (etcd only; see docs/locks-backends.md). `end_reason` is one of released, revoked,
    expired, session_closed, epoch_bumped.
    """

    key: str
    token: int
    session_id: str
    acquired_at: datetime
    ended_at: datetime | None
    end_reason: str | None


#: Upper bound of one grant_history() answer over HTTP (`GET /v1/history?limit=`).
DEFAULT_HISTORY_LIMIT = 10_000
MAX_HISTORY_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class RevokeResult:
    key: str
    revoked_token: int | None  # None when nobody held the key
    operator: str
    reason: str
    at: datetime


# --------------------------------------------------------------------------- validation


def validate_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidRequest("key must be a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(f"key longer than {MAX_KEY_LENGTH} characters")
    if not _KEY_RE.match(key):
        raise InvalidRequest("key may contain only letters, digits and : _ - . /")
    return key


def validate_ttl(ttl_s: float) -> float:
    if not (MIN_TTL_S <= ttl_s <= MAX_TTL_S):
        raise InvalidRequest(f"ttl_s must be between {MIN_TTL_S} and {MAX_TTL_S} seconds")
    return float(ttl_s)


def validate_wait(wait_s: float) -> float:
    if not (0 <= wait_s <= MAX_WAIT_S):
        raise InvalidRequest(f"wait_s must be between 0 and {MAX_WAIT_S} seconds")
    return float(wait_s)


def validate_operator(operator: str, reason: str) -> tuple[str, str]:
    if not operator or not operator.strip():
        raise InvalidRequest("an operator identity is required")
    if not reason or not reason.strip():
        raise InvalidRequest("a reason is required")
    return operator.strip(), reason.strip()


def compose_token(epoch: int, base: int) -> int:
    if not (0 <= base < TOKEN_EPOCH_STRIDE):
        raise ValueError("token base out of range for its epoch")
    return epoch * TOKEN_EPOCH_STRIDE + base


# --------------------------------------------------------------------------- the contract


@runtime_checkable
class LockBackend(Protocol):
    """What both backends implement, with identical observable semantics."""

    async def open_session(self, ttl_s: float) -> Session: ...

    async def keepalive(self, session_id: str) -> Session:
        """Extend the session's lease by its TTL; raises SessionNotFound if it already expired."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Close the session and release its locks. Closing an unknown session is a no-op."""
        ...

    async def acquire(self, session_id: str, key: str, wait_s: float) -> Grant | NotAcquired: ...

    async def renew(self, grant: Grant) -> Grant: ...

    async def release(self, grant: Grant) -> None: ...

    async def inspect(self, key: str) -> LockInfo: ...

    async def force_revoke(self, key: str, operator: str, reason: str) -> RevokeResult: ...

    async def bump_epoch(self, min_epoch: int, operator: str, reason: str) -> int:
        """Restore procedure: raise the token epoch to max(current + 1, min_epoch); returns it."""
        ...

    async def grant_history(
        self, key_prefix: str = "", *, limit: int | None = None
    ) -> list[GrantRecord]:
        """Every grant ever issued for keys starting with `key_prefix`, ordered by (key, token);
        at most `limit` records (None = all). Durable in the backend itself."""
        ...

    async def history_retained_since(self) -> datetime | None:
        """Grants that ended before this time may have been pruned from `grant_history`
        (retention); None: the history is complete since the first grant."""
        ...

    async def close(self) -> None: ...
