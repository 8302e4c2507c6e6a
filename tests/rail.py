"""The rail stub and the rail proxy as the tests run them, shared by tests/railstub,
tests/railproxy, tests/reconcile and tests/invariants (registered for the whole suite by
tests/conftest.py): the stub's admin surface, the session's stub servers, and a proxy on a test's
database submitting under genuine grants.

Each server runs in its own thread with its own event loop (tests.servers.ServerThread).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from common.db_roles import RAILPROXY
from railproxy import ProxySettings, RailProxyClient, SubmitContext, SubmitRequest
from railproxy import create_app as create_proxy
from railproxy.models import GrantIn
from railstub import StubSettings
from railstub import create_app as create_stub
from tests.conftest import as_role
from tests.grants import account_grant, public_keys
from tests.servers import ServerThread


@dataclass
class Stub:
    """The rail stub's admin surface: behaviour, reset and the movement log (the evidence)."""

    url: str

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as c:
            r = await c.request(method, path, **kw)
            r.raise_for_status()
            return r.json()

    async def reset(self) -> None:
        await self._call("POST", "/admin/reset")

    async def set(self, **behaviour: Any) -> None:
        await self._call("POST", "/admin/behaviour", json=behaviour)

    async def movements(self, client_reference: str | None = None) -> list[dict[str, Any]]:
        params = {"client_reference": client_reference} if client_reference else {}
        data = await self._call("GET", "/admin/movements", params=params)
        return list(data["movements"])

    async def counts(self) -> dict[str, int]:
        return dict((await self._call("GET", "/admin/movements"))["counts"])

    async def lookups(self) -> int:
        return int((await self._call("GET", "/admin/movements"))["lookups"])

    async def assert_no_duplicates(self) -> None:
        """The invariant: no client reference reached the rail twice."""
        counts = await self.counts()
        assert all(n == 1 for n in counts.values()), f"duplicate movements: {counts}"


STUB_SETTINGS = StubSettings(
    seed=7,
    latency_mode="fixed",
    latency_fixed_ms=5,
    ambiguity_rate=0.0,
    stall_s=30.0,
    visibility_delay_s=0.0,
    completion_delay_s=0.3,
)


@pytest.fixture(scope="session")
def stub_server() -> Iterator[ServerThread]:
    """The rail tests' stub: fixed latency, no random ambiguity, completion after 0.3 s."""
    server = ServerThread(create_stub(STUB_SETTINGS))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def stub(stub_server: ServerThread) -> Stub:
    """The session's stub, reset to its start-up behaviour with an empty movement log."""
    s = Stub(stub_server.url)
    await s.reset()
    return s


DECLINE_SUFFIX = "13"  # amounts ending in 13: the rail declines
AMBIGUOUS_SUFFIX = "77"  # amounts ending in 77: the rail records the movement, then answers 500
AMOUNT_RULES: list[Any] = [  # validated into railstub Rules by StubSettings
    {"amount_suffix": DECLINE_SUFFIX, "action": "decline"},
    {"amount_suffix": AMBIGUOUS_SUFFIX, "action": "ambiguous"},
]


@pytest.fixture(scope="session")
def ruled_stub_server() -> Iterator[ServerThread]:
    """The reconciler's and the checker's stub: the amount decides (AMOUNT_RULES), nothing is
    random (every rate 0, fixed latency), so a world is reset per test, never restarted."""
    settings = StubSettings(
        seed=11, latency_mode="fixed", latency_fixed_ms=2, ambiguity_rate=0.0, rules=AMOUNT_RULES
    )
    server = ServerThread(create_stub(settings))
    server.start()
    yield server
    server.stop()


def start_proxy(database_url: str, rail_url: str, **overrides: Any) -> ServerThread:
    """A real rail proxy, started, on `database_url` as the proxy's own role, in front of
    `rail_url`, verifying grants with the test keys; the caller stops it."""
    base: dict[str, Any] = {
        "database_url": as_role(database_url, RAILPROXY),
        "rail_url": rail_url,
        "rail_timeout_s": 2.0,
        "db_pool_max": 3,
        "grant_public_keys": public_keys(),
    }
    server = ServerThread(create_proxy(ProxySettings(**(base | overrides))))
    server.start()
    return server


async def signed_submit(
    proxy: RailProxyClient, payout_id: str, account_id: str, amount: int, token: int
) -> str:
    """A real proxy submission under the account's genuine grant for `token`, the payout id as
    its client reference; returns the recorded outcome."""
    result = await proxy.submit(
        SubmitRequest(
            payout_id=payout_id,
            account_id=account_id,
            amount=amount,
            client_reference=payout_id,
            token=token,
            grant=GrantIn(**account_grant(account_id, token).to_json()),
            context=SubmitContext(
                correlation_id=f"corr-{payout_id}",
                causation_id=f"cause-{payout_id}",
                deadline_at=datetime.now(UTC) + timedelta(seconds=5),
            ),
        )
    )
    return str(result.outcome)
