"""What `LockClient.acquire` hands out: a `Lease` (a server grant held by this process, with its
lock-lost signal), or `NotAcquiredError`, never anything else (FR-27).

Owns: the lease's liveness aid (`still_held`) and the signed grant it presents to an enforcement
point, renewed when close to its stated expiry. Must never: be taken for the safety mechanism
(the resources checking the token are), or exist without a grant from the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from lockservice.api import Grant, LockError
from lockservice.verifiers import SignedGrant

LostCallback = Callable[["Lease", str], None]


class LeaseOwner(Protocol):
    """What a `Lease` asks of the client that handed it out (`LockClient`): its clock and local
    deadline, the lost signal, and a renew. A Protocol, so that this module need not import the
    client that imports it."""

    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def deadline(self) -> float: ...
    @property
    def ttl_s(self) -> float: ...
    @property
    def safety_margin(self) -> float: ...
    def session_lost(self, reason: str) -> None: ...
    async def renew(self, lease: Lease) -> Lease: ...


class NotAcquiredError(LockError):
    """No grant within the wait budget. The caller must not perform the protected action."""

    code = "not_acquired"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key} not acquired ({reason})")
        self.key = key
        self.reason = reason


@dataclass(eq=False)
class Lease:
    """A grant held by this process, with its lock-lost signal.

    `lost` is set (once, never cleared) when the local deadline passes, the session is found
    expired, or a renew/release is refused. `token` is what every protected write must present.
    """

    grant: Grant
    _client: LeaseOwner = field(repr=False)
    #: The lock server's signature over `grant` (None only from a server that does not sign).
    signed: SignedGrant | None = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_reason: str | None = None
    released: bool = False

    @property
    def key(self) -> str:
        return self.grant.key

    @property
    def token(self) -> int:
        return self.grant.token

    def still_held(self) -> bool:
        """True while the conservative local deadline has not passed and nothing said otherwise.

        A LIVENESS AID, NOT THE SAFETY MECHANISM (FR-13): call it before every protected side
        effect so a paused or partitioned holder gives up early, but a True answer can be stale a
        microsecond later (the process can pause right after). What stops a second payout is the
        resource rejecting a token below its stored fence.
        """
        if self.released or self.lost.is_set():
            return False
        if self._client.clock() >= self._client.deadline:
            self._client.session_lost("deadline")
            return False
        return True

    async def signed_grant(self, *, now: datetime | None = None) -> SignedGrant | None:
        """The signed grant to present to an enforcement point, renewed first when its own
        `expires_at` is less than `ttl_s * safety_margin` away (on this host's wall clock).

        Why: a grant states the session's expiry when it was issued, and the session lives on by
        heartbeat; an enforcement point refuses a grant past its stated expiry, so a long critical
        section presents a renewed statement. NotHeld (and the lost signal) if the renew is
        refused: the grant is gone, and so is the right to write under it.
        """
        if self.signed is None:
            return None
        margin = timedelta(seconds=self._client.ttl_s * self._client.safety_margin)
        if (now or datetime.now(UTC)) >= self.signed.expires_at - margin:
            await self._client.renew(self)
        return self.signed
