"""The reusable conformance suite (railproxy.conformance) run against rail connections.

`railproxy` is the proxy behind its client; `railproxy-unguarded` is a deliberately broken
connection (submission guard off) that must FAIL the duplicate checks: the negative control
showing the suite can tell a non-conforming adapter apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from railproxy import RailProxyClient
from railproxy.client import SubmitResult
from railproxy.conformance import CHECKS, Harness, RailConnection
from railproxy.models import GrantIn, LookupResponse, SubmitRequest
from tests.grants import account_grant
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy


class _Granted:
    """The proxy's client with each submission carrying a grant signed by the test key, as the
    worker's submissions carry the lock service's (the suite itself knows nothing of grants)."""

    def __init__(self, client: RailProxyClient) -> None:
        self._client = client

    async def submit(self, req: SubmitRequest) -> SubmitResult:
        grant = GrantIn(**account_grant(req.account_id, req.token).to_json())
        return await self._client.submit(req.model_copy(update={"grant": grant}))

    async def lookup(self, client_reference: str) -> LookupResponse:
        return await self._client.lookup(client_reference)


def _harness(make_proxy: MakeProxy, stub: Stub, closed_port: int, **settings: Any) -> Harness:
    async def connect(rail_url: str) -> RailConnection:
        return _Granted((await make_proxy(rail_url=rail_url, **settings)).client)

    return Harness(
        connect=connect,
        simulator=stub,
        simulator_url=stub.url,
        unreachable_url=f"http://127.0.0.1:{closed_port}",
    )


@pytest.mark.parametrize("scenario", sorted(CHECKS))
async def test_railproxy_conforms(
    scenario: str, make_proxy: MakeProxy, stub: Stub, closed_port: int
) -> None:
    """The proxy behind its client meets every scenario of the rail-connection contract."""
    check: Callable[[Harness], Awaitable[None]] = CHECKS[scenario]
    await check(_harness(make_proxy, stub, closed_port))
    await stub.assert_no_duplicates()


@pytest.mark.parametrize("scenario", ["duplicate_sequential", "duplicate_concurrent"])
async def test_unguarded_connection_fails_duplicate_checks(
    scenario: str, make_proxy: MakeProxy, stub: Stub, closed_port: int
) -> None:
    """Negative control: a connection without the submission guard is caught by the suite."""
    harness = _harness(
        make_proxy, stub, closed_port, enforce_submission_guard=False, experiment_mode=True
    )
    with pytest.raises(AssertionError):
        await CHECKS[scenario](harness)
