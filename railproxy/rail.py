"""The rail adapter: how the proxy speaks to the rail stub's HTTP contract (STD01-09 lineage).

Classification is the whole point of this module. NOT_SUBMITTED is returned only with
authoritative evidence that no byte of the instruction reached the rail: a connect error, a
connect timeout, a pool timeout, or an explicit 503 NOT_ACCEPTED from the rail. Anything else that
is not a clear answer (read timeout, reset, 5xx, garbage) is UNKNOWN: the rail may have moved
money, so the payout becomes ambiguous and is resolved by lookup, never by resubmission.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import httpx

from common.backoff import full_jitter
from common.correlation import httpx_hooks
from common.credentials import auth_headers, read_token
from railproxy.budget import SharedBudget
from railproxy.errors import LookupUnavailable, Rejected
from railproxy.models import LookupResponse, Outcome, SubmitRequest
from railproxy.settings import ProxySettings

# Errors raised before the request could be written to a fresh connection.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


RailStatus = Literal["settled", "pending", "declined"]


@dataclass(frozen=True)
class RailAnswer:
    outcome: Outcome
    rail_status: RailStatus | None = None
    rail_movement_id: str | None = None
    error_class: str | None = None
    timed_out: bool = False

    @property
    def technical_success(self) -> bool:
        """A clear answer from the rail (a decline is a business outcome, not a failure)."""
        return self.outcome in (Outcome.ACKED, Outcome.DECLINED)


def rail_auth_headers(settings: ProxySettings) -> dict[str, str]:
    """The proxy's credential at the rail (a real rail authenticates its client)."""
    return auth_headers(read_token(token_file=settings.token_file, what="RAILPROXY_TOKEN_FILE"))


def submit_client(settings: ProxySettings) -> httpx.AsyncClient:
    """The client for submissions. It must never retry, at any layer (UC-05, FR-20).

    The rail has no idempotency key: a retried POST is a second payment. `retries=0` keeps httpx
    from retrying even the connect step, and nothing wraps this client in a retry loop. No
    keep-alive either: every submission opens a fresh connection, so a connect error proves that
    nothing was sent, whereas a stale pooled connection would fail ambiguously mid-request.
    """
    return httpx.AsyncClient(
        base_url=settings.rail_url,
        headers=rail_auth_headers(settings),
        transport=httpx.AsyncHTTPTransport(
            retries=0,
            limits=httpx.Limits(max_keepalive_connections=0),
            verify=settings.client_verify(),  # the rail's certificate vs RAILPROXY_TLS_CA_FILE
        ),
        follow_redirects=False,  # a redirect would resend the instruction somewhere else
        event_hooks=httpx_hooks(),  # the submission's X-Correlation-Id (railproxy.app binds it)
    )


def lookup_client(settings: ProxySettings) -> httpx.AsyncClient:
    """Read-only calls (lookup, health probes) may be retried; the retry loop is ours, bounded."""
    return httpx.AsyncClient(
        base_url=settings.rail_url,
        headers=rail_auth_headers(settings),
        timeout=settings.lookup_timeout_s,
        transport=httpx.AsyncHTTPTransport(retries=0, verify=settings.client_verify()),
        event_hooks=httpx_hooks(),
    )


async def forward(
    client: httpx.AsyncClient, req: SubmitRequest, budget_s: float, connect_timeout_s: float
) -> RailAnswer:
    """Send the instruction ONCE and classify the result. Never raises for rail behaviour."""
    # The connect timeout is kept below the whole budget so that a slow connect surfaces as a
    # ConnectTimeout (provably not sent) before the overall deadline cancels the call.
    timeout = httpx.Timeout(budget_s, connect=min(connect_timeout_s, budget_s * 0.8))
    body = {
        "client_reference": req.client_reference,
        "account_id": req.account_id,
        "amount": req.amount,
    }
    try:
        async with asyncio.timeout(budget_s):
            response = await client.post("/payments", json=body, timeout=timeout)
    except _NOT_SENT as exc:
        return RailAnswer(
            Outcome.NOT_SUBMITTED,
            error_class=type(exc).__name__,
            timed_out=isinstance(exc, httpx.TimeoutException),
        )
    except (httpx.TimeoutException, TimeoutError) as exc:
        return RailAnswer(Outcome.UNKNOWN, error_class=type(exc).__name__, timed_out=True)
    except httpx.HTTPError as exc:
        return RailAnswer(Outcome.UNKNOWN, error_class=type(exc).__name__)
    return classify(response)


def classify(response: httpx.Response) -> RailAnswer:
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {}
    if response.status_code == 503 and data.get("code") == "NOT_ACCEPTED":
        return RailAnswer(Outcome.NOT_SUBMITTED, error_class="RailNotAccepted")
    status = data.get("status")
    movement = data.get("movement_id") if isinstance(data.get("movement_id"), str) else None
    if response.status_code in (200, 202) and status in ("settled", "pending"):
        return RailAnswer(Outcome.ACKED, rail_status=status, rail_movement_id=movement)
    if response.status_code == 200 and status == "declined":
        return RailAnswer(Outcome.DECLINED, rail_status=status, rail_movement_id=movement)
    # Any other answer is not evidence of what happened at the rail.
    return RailAnswer(
        Outcome.UNKNOWN,
        error_class=f"HTTP{response.status_code}",
        timed_out=response.status_code == 504,
    )


async def lookup(
    client: httpx.AsyncClient,
    client_reference: str,
    *,
    budget: SharedBudget,
    attempts: int,
    base_delay_s: float,
    rng: random.Random,
) -> LookupResponse:
    """Read-only lookup by client reference with bounded retry, exponential backoff, full jitter.

    Every try is a call to the rail and takes the Connection's lookup budget (a slot and a
    permit shared by every replica, `railproxy.budget`); a try the budget refuses sends nothing
    and counts as a failed try."""
    last = "no attempt made"
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(full_jitter(attempt - 1, base_s=base_delay_s, rng=rng))
        try:
            async with budget.lease(wait_s=0) as held:
                response = await client.get(
                    "/lookup",
                    params={"client_reference": client_reference},
                    timeout=max(held.remaining_s(), 0.001),  # never past the slot's lease
                )
            if response.status_code == 200:
                data = response.json()
                return LookupResponse(
                    client_reference=client_reference,
                    status=data["status"],
                    observed_at=datetime.now(UTC),
                    complete_through=data.get("complete_through"),
                    complete_from=data.get("complete_from"),
                )
            last = f"HTTP {response.status_code}"
        except Rejected as exc:  # the lookup budget refused this try: nothing was sent
            last = exc.code
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = type(exc).__name__
    raise LookupUnavailable(f"lookup failed after {attempts} attempts: {last}")


async def probe(client: httpx.AsyncClient, timeout_s: float) -> tuple[bool, str]:
    """Half-open probe: the rail's read-only lookup of a reference no payout ever uses.

    It takes no budget: one call per replica per `breaker_open_s`, only while that replica's
    breaker is open (it sends no submission then), and it must reach the rail to close the
    breaker even while the database is slow (docs/rail.md "Replicas")."""
    started = time.monotonic()
    try:
        response = await client.get(
            "/lookup", params={"client_reference": "railproxy-probe"}, timeout=timeout_s
        )
    except httpx.HTTPError as exc:
        return False, type(exc).__name__
    ok = response.status_code == 200
    return ok, f"HTTP {response.status_code} in {time.monotonic() - started:.3f}s"
