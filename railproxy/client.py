"""Async client of the rail proxy, for the workflow activities.

`submit` never retries (UC-05): a proxy that received the request may have forwarded it, and the
attempt guard would refuse the second call anyway. Transport failures are classified like the
proxy classifies the rail: a connect error means the proxy never saw the request
(NOT_SUBMITTED); any failure after the request was sent is UNKNOWN -- resolve it with
`get_attempts` (conclusive once the caller's deadline has passed: the proxy records no attempt
after the deadline) and `lookup`, never by submitting again.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx

from common.correlation import httpx_hooks
from common.credentials import auth_headers
from railproxy.errors import LookupUnavailable, ProxyClientError
from railproxy.models import (
    AttemptRecord,
    AttemptsResponse,
    HandoffCertainty,
    LookupResponse,
    Outcome,
    SubmitRequest,
)

_TIMEOUT_MARGIN_S = 2.0


@dataclass(frozen=True)
class SubmitResult:
    """Typed answer of a submit: either a recorded outcome or a rejection `code`."""

    handoff_certainty: HandoffCertainty
    http_status: int | None
    outcome: Outcome | None = None
    code: str | None = None  # STALE_TOKEN, DUPLICATE_SUBMISSION, ..., PROXY_UNAVAILABLE
    message: str = ""
    attempt_id: int | None = None
    rail_status: str | None = None
    presented_token: int | None = None
    highest_token: int | None = None

    @property
    def rejected(self) -> bool:
        return self.code is not None


class RailProxyClient:
    def __init__(
        self,
        base_url: str,
        *,
        read_timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        token: str | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        # `verify`: the proxy's certificate is checked against it (common.tls.client_context).
        # `token`: the worker's bearer credential (common.credentials), sent on every call.
        headers = auth_headers(token)
        # No retries and no keep-alive for submits: a retried POST could be a second payment, and
        # a stale pooled connection would turn a clean refusal into an ambiguous failure.
        self._submit = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            follow_redirects=False,
            event_hooks=httpx_hooks(),  # X-Correlation-Id of the bound context
            transport=transport
            or httpx.AsyncHTTPTransport(
                retries=0, limits=httpx.Limits(max_keepalive_connections=0), verify=verify
            ),
        )
        self._read = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=read_timeout_s,
            event_hooks=httpx_hooks(),
            transport=transport or httpx.AsyncHTTPTransport(retries=0, verify=verify),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._submit.aclose()
        await self._read.aclose()

    async def submit(self, req: SubmitRequest) -> SubmitResult:
        """One call, never retried. The HTTP timeout follows the request's absolute deadline."""
        remaining = (req.context.deadline_at - datetime.now(UTC)).total_seconds()
        timeout = httpx.Timeout(max(remaining, 0.0) + _TIMEOUT_MARGIN_S, connect=1.0)
        try:
            response = await self._submit.post(
                "/v1/submissions", json=req.model_dump(mode="json"), timeout=timeout
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return SubmitResult(
                HandoffCertainty.NOT_SUBMITTED,
                None,
                code="PROXY_UNAVAILABLE",
                message=type(exc).__name__,
                presented_token=req.token,
            )
        except httpx.HTTPError as exc:
            return SubmitResult(
                HandoffCertainty.UNKNOWN,
                None,
                code="PROXY_NO_ANSWER",
                message=type(exc).__name__,
                presented_token=req.token,
            )
        return _parse_submit(response, req.token)

    async def get_attempts(self, payout_id: str) -> list[AttemptRecord]:
        response = await self._read.get(f"/v1/payouts/{quote(payout_id, safe='')}/attempts")
        if response.status_code != 200:
            raise ProxyClientError(f"get_attempts: HTTP {response.status_code}")
        return AttemptsResponse.model_validate(response.json()).attempts

    async def lookup(self, client_reference: str, payout_id: str | None = None) -> LookupResponse:
        """The rail's status for a reference (the proxy already retried; raises if unavailable).

        `absent` is the proxy's judgement, made on its attempt records and margins (of the payout
        when `payout_id` is given); the caller must not judge absence with its own clock.
        """
        params = {"client_reference": client_reference}
        if payout_id is not None:
            params["payout_id"] = payout_id
        response = await self._read.get("/v1/lookup", params=params)
        if response.status_code == 503:
            raise LookupUnavailable(response.json().get("message", "lookup unavailable"))
        if response.status_code != 200:
            raise ProxyClientError(f"lookup: HTTP {response.status_code}")
        return LookupResponse.model_validate(response.json())

    async def health(self) -> dict[str, Any]:
        response = await self._read.get("/health")
        data: dict[str, Any] = response.json()
        return data


def _parse_submit(response: httpx.Response, token: int) -> SubmitResult:
    try:
        data = response.json()
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if response.status_code in (200, 202) and "outcome" in data:
        return SubmitResult(
            HandoffCertainty(data["handoff_certainty"]),
            response.status_code,
            outcome=Outcome(data["outcome"]),
            attempt_id=data.get("attempt_id"),
            rail_status=data.get("rail_status"),
            presented_token=token,
        )
    if "code" in data and "handoff_certainty" in data:
        return SubmitResult(
            HandoffCertainty(data["handoff_certainty"]),
            response.status_code,
            code=data["code"],
            message=data.get("message", ""),
            presented_token=data.get("presented_token"),
            highest_token=data.get("highest_token"),
        )
    # The proxy answered something unexpected after receiving the request: it may have forwarded.
    return SubmitResult(
        HandoffCertainty.UNKNOWN,
        response.status_code,
        code="PROXY_BAD_ANSWER",
        message=response.text[:200],
        presented_token=token,
    )
