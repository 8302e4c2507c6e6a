"""The SDK's calls to the lock server: one httpx client on the lean keep-alive transport, and every
call with bounded, jittered retries (FR-28) on transport errors and 503.

Owns: the choice of transport, the retry loop and its full-jitter backoff, and turning the
server's answers into the contract's errors (lockservice.api). Must never: retry past its bound
or its deadline, or turn a refusal into a success: a 503 (backend down, or `restore_detected`)
fails closed after the bound (FR-27).
"""

from __future__ import annotations

import importlib.util
import random
import ssl
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from common import tracing
from common.backoff import full_jitter
from common.correlation import httpx_hooks
from common.credentials import auth_headers
from lockservice import api
from lockservice.api import LockError
from lockservice.sdk.lease import NotAcquiredError
from lockservice.sdk.transport import KeepAliveTransport
from lockservice.verifiers import SignedGrant

# httpcore runs `import sniffio` on every request; when sniffio is not installed (anyio >= 4.5 no
# longer needs it) each failed import searches sys.path again: ~0.3 ms, four times per request,
# which was most of the SDK's overhead in the benchmark. A None entry makes that import fail
# at once, and httpcore then assumes asyncio, which is what this SDK runs on.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]  # None = "known absent"

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
#: The bounded retries of every call (FR-28): tries, and the full-jitter backoff's base and cap.
DEFAULT_ATTEMPTS = 4
DEFAULT_BACKOFF_BASE_S = 0.05
DEFAULT_BACKOFF_MAX_S = 2.0

ERROR_BY_CODE: dict[str, type[LockError]] = {
    c.code: c for c in (api.InvalidRequest, api.SessionNotFound, api.NotHeld)
}


def choose_transport(
    base_url: str, verify: ssl.SSLContext | bool, transport: httpx.AsyncBaseTransport | None
) -> httpx.AsyncBaseTransport:
    """`transport` if given, else the lean keep-alive transport where it applies."""
    if transport is None and base_url.startswith("http://"):
        # The lean keep-alive transport: same httpx API and errors, ~0.5 ms less per request;
        # traced (a client span, and `traceparent` to the server) when tracing is on.
        transport = tracing.traced_transport(KeepAliveTransport())
    elif transport is None and base_url.startswith("https://") and not isinstance(verify, bool):
        # https, the same lean transport over TLS: the server verified against `verify` (an
        # `ssl.SSLContext` trusting the deployment's CA: common.tls.client_context).
        transport = tracing.traced_transport(KeepAliveTransport(verify))
    elif transport is None:
        # https with the system's trust store (verify=True): httpx's own transport.
        transport = httpx.AsyncHTTPTransport(verify=verify)  # traced as every httpx transport
    return transport


class BoundedCalls:
    """Requests to one lock server, each retried a bounded number of times."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport,
        token: str | None,
        request_timeout_s: float,
        attempts: int,
        backoff_base_s: float,
        backoff_max_s: float,
        clock: Clock,
        sleep: Sleep,
        rng: random.Random,
    ) -> None:
        self.request_timeout_s = request_timeout_s
        self.attempts, self.backoff_base_s, self.backoff_max_s = (
            attempts,
            backoff_base_s,
            backoff_max_s,
        )
        self.clock, self.sleep, self.rng = clock, sleep, rng
        # `token`: this component's bearer credential (common.credentials), sent on every call.
        # Every request carries the caller's correlation id (common.correlation, bound by the
        # activity that asks), so the lock server's events for it carry the same id.
        self.http = httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            timeout=request_timeout_s,
            headers=auth_headers(token),
            event_hooks=httpx_hooks(),
        )
        self.http_attempts = 0  # requests sent, for tests and diagnostics

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)], so retries never herd."""
        return full_jitter(
            attempt, base_s=self.backoff_base_s, cap_s=self.backoff_max_s, rng=self.rng
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        attempts: int | None = None,
        timeout_s: float | None = None,
        wait_in_body: bool = False,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """Bounded, jittered retries on transport errors and 503. `json` may be a callable,
        evaluated per attempt. With `wait_in_body`, each attempt's timeout adds the body's
        `wait_s`. With `deadline` (on `clock`), no attempt starts or runs past it."""
        tries = attempts if attempts is not None else self.attempts
        if tries < 1:
            raise api.InvalidRequest("attempts must be at least 1")
        last = "no attempt"
        for attempt in range(tries):
            if attempt:
                await self.sleep(self.backoff(attempt))
            body = json() if callable(json) else json
            timeout = timeout_s or self.request_timeout_s
            if wait_in_body and body is not None:
                timeout += float(body["wait_s"])
            if deadline is not None:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                timeout = min(timeout, remaining)
            self.http_attempts += 1
            try:
                resp = await self.http.request(method, path, json=body, timeout=timeout)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code == 503:
                # restore_detected is a 503 too: fail closed, but say which (the operator's cue).
                last = f"503 {error_code(resp) or 'backend unavailable'}"
                continue
            return decode(resp)
        raise api.BackendUnavailable(f"{method} {path} failed after {tries} attempts ({last})")


def retry_budget_s(
    attempts: int = DEFAULT_ATTEMPTS,
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
) -> float:
    """The longest the backoffs of one bounded call add up to: attempt `a` (from 1) waits at most
    `min(backoff_max_s, backoff_base_s * 2**a)` (full jitter), and against a server that refuses
    connections at once (a SIGKILLed lock server, nothing listening) the tries themselves take
    no time. A release that fails for longer than this becomes pending (`LockClient.release`).
    With the defaults: 0.1 + 0.2 + 0.4 = 0.7 s. Tests and the chaos harness derive outage
    lengths from it (docs/chaos.md)."""
    return float(sum(min(backoff_max_s, backoff_base_s * 2**a) for a in range(1, attempts)))


def error_code(resp: httpx.Response) -> str | None:
    try:
        body = resp.json()
    except ValueError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def decode(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code == 204:
        return {}
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if resp.is_success:
        return body
    code, message = str(body.get("code", "")), str(body.get("message", resp.text[:200]))
    if code == "not_acquired":
        raise NotAcquiredError("", str(body.get("reason")))
    if code in ERROR_BY_CODE:
        raise ERROR_BY_CODE[code](message)
    if resp.status_code in (400, 422):
        raise api.InvalidRequest(message)
    if resp.status_code in (401, 403):
        raise LockError(f"lock server refused this component's credential ({code}): {message}")
    raise LockError(f"unexpected {resp.status_code} from lock server: {message}")


def signed_of(data: dict[str, Any]) -> SignedGrant | None:
    """The signed form of a grant answer; the SDK does not verify it (the resources do)."""
    if not data.get("signature") or not data.get("kid"):
        return None
    return SignedGrant.from_json(data)
