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
#: The highest epoch whose whole token range fits the token field, a signed 64-bit integer at every
#: enforcement point (BIGINT): (MAX_EPOCH + 1) * TOKEN_EPOCH_STRIDE - 1 == 2**63 - 1.
MAX_EPOCH = (1 << 63) // TOKEN_EPOCH_STRIDE - 1
#: A bump may go at most this far above max(current epoch, the epoch the fences require): one
#: bump per restore needs 1; a fuzzer or a typo must not burn the token space (issue 13).
MAX_EPOCH_STEP = 16
MAX_KEY_LENGTH = 256
MIN_TTL_S = 1.0
MAX_TTL_S = 3600.0
MAX_WAIT_S = 300.0
_KEY_RE = re.compile(r"^[A-Za-z0-9:_\-./]+$")


# --------------------------------------------------------------------------- errors
#
# LockError
#  +-- InvalidRequest          bad key, TTL, wait budget, missing operator or reason
#  |    +-- EpochRefused       a bump beyond the bounded step or the 64-bit token space
#  +-- SessionNotFound         unknown or already expired/closed session
#  +-- NotHeld                 renew/release of a grant that is no longer valid
#  +-- BackendUnavailable      the backend cannot be reached; callers fail closed (FR-27)
#       +-- RestoreDetected    the backend is behind what this server issued (restored data)


class LockError(Exception):
    """Base class of every lock-service error. `code` is a stable machine-readable name."""

    code = "lock_error"


class InvalidRequest(LockError):
    code = "invalid_request"


class EpochRefused(InvalidRequest):
    """A well-formed bump refused for where the epoch stands now (more than MAX_EPOCH_STEP above
    it, or past the token space): a conflict with the current state (HTTP 409), not bad input."""

    code = "epoch_refused"


class SessionNotFound(LockError):
    code = "session_not_found"


class NotHeld(LockError):
    """The grant presented is not (or no longer) the valid grant of its key."""

    code = "not_held"


class BackendUnavailable(LockError):
    code = "backend_unavailable"


class RestoreDetected(BackendUnavailable):
    """The backend's data is older than what this lock server already issued on it (a restore
    from backup without the epoch bump): no grant until `bump-epoch`
    (lockservice.server.watermark)."""

    code = "restore_detected"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class IssuancePosition:
    """Where the backend's issuance stands: its epoch and a backend-wide counter that every grant
    raises and only a restore lowers (PostgreSQL: the grant-history sequence; etcd: the cluster
    revision). lockservice.server.watermark compares it with what this server saw before."""

    epoch: int
    counter: int
    #: A record the backend's data holds of its latest grant, for a counter that can run ahead
    #: of the data: PostgreSQL's sequence is WAL-logged 32 values ahead, so a standby promoted
    #: after losing grants continues ABOVE the lost ids (stack.replication). PostgreSQL: the
    #: highest committed grant_history id; 0 where the counter cannot run ahead (etcd).
    anchor: int = 0
    #: The anchor the caller asked about (`issuance_position(since=...)`) is not in the data:
    #: a grant it saw was lost (a failover to a standby that lacked it, or a restore).
    lost: bool = False


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


def min_epoch_for(highest_fence_seen: int) -> int:
    """The smallest epoch whose every token exceeds `highest_fence_seen` (0 = nothing seen)."""
    if highest_fence_seen < 0:
        raise InvalidRequest("a fence is never negative")
    return highest_fence_seen // TOKEN_EPOCH_STRIDE + 1


def next_epoch(current: int, min_epoch: int, highest_fence_seen: int | None = None) -> int:
    """The epoch a bump sets: max(current + 1, min_epoch, the epoch above the fences seen).

    Bounded (issue 13): `min_epoch` may exceed max(current, needed) by at most MAX_EPOCH_STEP,
    where `needed` comes only from evidence (the fences the offline bump read), and the result
    must leave its whole token range inside a signed 64-bit integer. Raises InvalidRequest
    otherwise; the caller then changes nothing."""
    if not isinstance(min_epoch, int) or min_epoch < 0:
        raise InvalidRequest("min_epoch must be a non-negative integer")
    needed = 0 if highest_fence_seen is None else min_epoch_for(highest_fence_seen)
    ceiling = max(current, needed) + MAX_EPOCH_STEP
    if min_epoch > ceiling:
        raise EpochRefused(
            f"min_epoch {min_epoch} is more than {MAX_EPOCH_STEP} above the current epoch"
            f" {current}{'' if not needed else f' and the needed epoch {needed}'}: refused;"
            " run the offline bump-epoch, which works the needed epoch out from the fences"
        )
    new = max(current + 1, min_epoch, needed)
    if new > MAX_EPOCH:
        raise EpochRefused(
            f"epoch {new} would leave the 64-bit token space (max epoch {MAX_EPOCH}); a fence that"
            " high was not issued by this lock service"
        )
    return new


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

    async def bump_epoch(
        self, min_epoch: int, operator: str, reason: str, *, highest_fence_seen: int | None = None
    ) -> int:
        """Restore procedure: raise the token epoch to `next_epoch(current, min_epoch,
        highest_fence_seen)` (bounded; InvalidRequest changes nothing); returns it. The fence
        evidence goes into the audit record."""
        ...

    async def issuance_position(self, since: int = 0) -> IssuancePosition:
        """The current epoch and backend-wide issuance counter (cheap; read after every grant);
        `since`: an anchor read before (0: none), reported `lost` if the data no longer has it."""
        ...

    async def highest_token_issued(self) -> int:
        """An upper bound of every token this backend's data could have issued (0: none), for the
        offline bump's H. May scan; never on the grant path."""
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
