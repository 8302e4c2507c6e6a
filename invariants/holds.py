"""The checker's source of the payout locks held right now (INV-10's blocked-account rule,
`invariants.blocked`): the PostgreSQL backend's `lockservice.holders` joined with its live
sessions, or the lock server's `GET /v1/locks?key=` for each account's key (either backend).

Must never: write, or act on a lock (it reads; a revoke is an operator's decision). Each source
returns every holding of the accounts it was given or raises `HoldSourceUnavailable`: a partial
answer could hide a blocked account.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import asyncpg
import httpx

from common.credentials import auth_headers
from common.lockkey import PAYOUT_KEY_PREFIX, lock_key
from invariants.errors import HoldSourceUnavailable
from invariants.evidence import HoldFact

__all__ = ["HoldSource", "lock_server_hold_source", "postgres_hold_source"]

#: The payout locks of these accounts held right now by live sessions.
HoldSource = Callable[[Sequence[str]], Awaitable[Sequence[HoldFact]]]

_HOLDS_SQL = """
SELECT h.key, h.token, h.session_id::text AS session_id, h.acquired_at,
       clock_timestamp() AS observed_at
  FROM lockservice.holders h
  JOIN lockservice.sessions s ON s.session_id = h.session_id
 WHERE s.expires_at > clock_timestamp() AND starts_with(h.key, $1)
"""


def postgres_hold_source(database_url: str, *, backend_prefix: str = "") -> HoldSource:
    """`lockservice.holders` of live sessions (PostgreSQL lock backend), read-only, on the
    database's clock (the clock that stamped `acquired_at`)."""

    async def fetch(accounts: Sequence[str]) -> Sequence[HoldFact]:
        wanted = {lock_key(a) for a in accounts}
        try:
            conn = await asyncpg.connect(database_url, timeout=10)
        except (OSError, asyncpg.PostgresError) as exc:
            raise HoldSourceUnavailable(f"lock holdings unavailable: {exc}") from exc
        try:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                rows = await conn.fetch(_HOLDS_SQL, backend_prefix + PAYOUT_KEY_PREFIX)
        except asyncpg.PostgresError as exc:
            raise HoldSourceUnavailable(f"lock holdings unavailable: {exc}") from exc
        finally:
            await conn.close()
        cut = len(backend_prefix)
        holds = [
            HoldFact(
                key=r["key"][cut:],
                token=int(r["token"]),
                session_id=r["session_id"],
                acquired_at=r["acquired_at"],
                observed_at=r["observed_at"],
            )
            for r in rows
        ]
        return [h for h in holds if h.key in wanted]

    return fetch


def lock_server_hold_source(
    base_url: str,
    *,
    concurrency: int = 16,
    timeout_s: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
    token: str | None = None,
) -> HoldSource:
    """The lock server's `GET /v1/locks?key=payout:{account}` per account (either backend).

    `observed_at` is this host's clock when the answer came, and the etcd backend stamps
    `acquired_at` with the lock server's: run them on one host or with synchronised clocks (a
    skew of seconds is small beside the rule's bound)."""

    async def fetch(accounts: Sequence[str]) -> Sequence[HoldFact]:
        gate = asyncio.Semaphore(concurrency)
        try:
            async with httpx.AsyncClient(
                base_url=base_url,
                timeout=timeout_s,
                transport=transport,
                headers=auth_headers(token),
            ) as client:

                async def one(account_id: str) -> HoldFact | None:
                    async with gate:
                        r = await client.get("/v1/locks", params={"key": lock_key(account_id)})
                    r.raise_for_status()
                    body = r.json()
                    if body.get("holder_session") is None or body.get("token") is None:
                        return None
                    return HoldFact(
                        key=str(body["key"]),
                        token=int(body["token"]),
                        session_id=str(body["holder_session"]),
                        acquired_at=datetime.fromisoformat(str(body["acquired_at"])),
                        observed_at=datetime.now(UTC),
                    )

                found = await asyncio.gather(*(one(a) for a in sorted(set(accounts))))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise HoldSourceUnavailable(f"lock holdings unavailable: {exc}") from exc
        return [h for h in found if h is not None]

    return fetch
