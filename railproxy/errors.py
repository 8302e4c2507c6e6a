"""Typed errors of the rail proxy.

RailProxyError
 +-- Rejected                 refused before anything was forwarded: handoff NOT_SUBMITTED
 |    +-- InvalidGrant        403 INVALID_GRANT: the grant is missing, not signed by an accepted
 |                            key, for another account's key or token, or expired (INV-07)
 |    +-- StaleToken          409 STALE_TOKEN: token below the account's high-water mark (FR-17)
 |    +-- DuplicateSubmission 409 DUPLICATE_SUBMISSION: the payout already has an attempt (FR-18)
 |    +-- CircuitOpen         503 CIRCUIT_OPEN: the breaker is OPEN or HALF_OPEN
 |    +-- AdmissionFull       503 ADMISSION_FULL: bulkhead and its queue are full
 |    +-- RateLimited         429 RATE_LIMITED: token bucket empty
 |    +-- DeadlineExceeded    504 DEADLINE_EXCEEDED: no useful budget left before the deadline
 |    +-- StoreUnavailable    503 STORE_UNAVAILABLE: the attempt could not be recorded
 |    +-- RailNotReached      503 RAIL_UNAVAILABLE: recorded, but authoritative evidence that no
 |                            byte reached the rail (connect error/timeout, 503 NOT_ACCEPTED)
 +-- LookupUnavailable        503 LOOKUP_UNAVAILABLE: read-only lookup failed after bounded retry
 +-- ProxyClientError         raised by railproxy.client for protocol errors
 +-- StartupRefused           the process must not start: an experiment switch is off outside a
                              verified experiment mode against the rail stub (FR-29)
"""

from __future__ import annotations


class RailProxyError(Exception):
    """Base class of every rail-proxy error. `code` is stable and machine-readable."""

    code = "RAIL_PROXY_ERROR"
    http_status = 500


class Rejected(RailProxyError):
    """A submission refused before it was forwarded; safe to try again after re-acquiring."""

    def __init__(
        self, message: str, *, presented_token: int | None = None, highest_token: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.presented_token = presented_token
        self.highest_token = highest_token


class InvalidGrant(Rejected):
    """Not a grant the lock service issued for this submission; `reason` names the check."""

    code = "INVALID_GRANT"
    http_status = 403

    def __init__(self, message: str, *, reason: str, presented_token: int | None = None) -> None:
        super().__init__(message, presented_token=presented_token)
        self.reason = reason


class StaleToken(Rejected):
    code = "STALE_TOKEN"
    http_status = 409


class DuplicateSubmission(Rejected):
    code = "DUPLICATE_SUBMISSION"
    http_status = 409


class CircuitOpen(Rejected):
    code = "CIRCUIT_OPEN"
    http_status = 503


class AdmissionFull(Rejected):
    code = "ADMISSION_FULL"
    http_status = 503


class RateLimited(Rejected):
    code = "RATE_LIMITED"
    http_status = 429


class DeadlineExceeded(Rejected):
    code = "DEADLINE_EXCEEDED"
    http_status = 504


class StoreUnavailable(Rejected):
    code = "STORE_UNAVAILABLE"
    http_status = 503


class RailNotReached(Rejected):
    code = "RAIL_UNAVAILABLE"
    http_status = 503


class LookupUnavailable(RailProxyError):
    code = "LOOKUP_UNAVAILABLE"
    http_status = 503


class ProxyClientError(RailProxyError):
    code = "PROXY_CLIENT_ERROR"


class StartupRefused(RailProxyError):
    """Raised before anything starts; the message names the variable to change."""

    code = "STARTUP_REFUSED"
