"""Fixtures: real rail proxies as uvicorn servers, on real PostgreSQL, in front of the session's
rail stub (`stub_server` and `stub`, from tests/rail.py, which the rail stub's tests share).

Each server runs in its own thread with its own event loop, so a synchronous test (schemathesis)
can call it without blocking the loop the server runs on.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest

from common.db_roles import RAILPROXY
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from railproxy import ProxySettings, RailProxyClient, SubmitContext, SubmitRequest
from railproxy import create_app as create_proxy
from railproxy.models import GrantIn
from stack.embedded.shared import free_port
from tests.conftest import as_role
from tests.grants import account_grant, public_keys
from tests.servers import ServerThread


@dataclass
class Proxy:
    url: str
    settings: ProxySettings
    client: RailProxyClient

    async def health(self) -> dict[str, Any]:
        return await self.client.health()


@pytest.fixture(scope="session")
async def rail_db(pg_server_url: str) -> AsyncIterator[str]:
    """A fresh database with the railproxy schema migrated."""
    url = await create_database(pg_server_url, prefix="rail_t")
    await migrate(url, schemas={"railproxy"})
    yield url
    await drop_database(pg_server_url, url)


def proxy_settings(rail_db: str, rail_url: str, **overrides: Any) -> ProxySettings:
    base: dict[str, Any] = {
        "database_url": as_role(rail_db, RAILPROXY),  # the proxy's own role
        "rail_url": rail_url,
        "rail_timeout_s": 0.5,
        "connect_timeout_s": 0.3,
        "breaker_open_s": 0.3,
        "breaker_min_samples": 5,
        "lookup_base_delay_s": 0.01,
        "db_pool_max": 5,
        "grant_public_keys": public_keys(),
        # The Connection is the key of its shared budget (railproxy.budget): a test's own, so
        # that no test inherits another's busy slots or permits.
        "connection_id": f"rail-t-{uuid.uuid4().hex[:10]}",
    }
    return ProxySettings(**(base | overrides))


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def make_proxy(rail_db: str, stub_server: ServerThread) -> AsyncIterator[MakeProxy]:
    """Start proxies (pointing at the stub unless `rail_url` is given); stopped after the test."""
    started: list[tuple[ServerThread, RailProxyClient]] = []
    connection = f"rail-t-{uuid.uuid4().hex[:10]}"  # one Connection (one budget) per test

    async def make(**overrides: Any) -> Proxy:
        overrides.setdefault("rail_url", stub_server.url)
        overrides.setdefault("connection_id", connection)
        settings = proxy_settings(rail_db, **overrides)
        server = ServerThread(create_proxy(settings))
        server.start()
        client = RailProxyClient(server.url)
        started.append((server, client))
        return Proxy(server.url, settings, client)

    yield make
    for server, client in started:
        await client.aclose()
        server.stop()


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> Proxy:
    return await make_proxy()


def submit_request(
    *,
    payout_id: str | None = None,
    account_id: str | None = None,
    amount: int = 1000,
    token: int = 1,
    reference: str | None = None,
    deadline_s: float = 5.0,
    grant: dict[str, Any] | Literal["signed"] | None = "signed",
) -> SubmitRequest:
    """A submission; its grant is signed by the test key for the account and token unless the
    test passes another grant (or None for none)."""
    payout_id = payout_id or f"p-{uuid.uuid4().hex[:12]}"
    account_id = account_id or f"a-{uuid.uuid4().hex[:12]}"
    if grant == "signed":
        grant = account_grant(account_id, token).to_json()
    return SubmitRequest(
        payout_id=payout_id,
        account_id=account_id,
        grant=None if grant is None else GrantIn(**grant),
        amount=amount,
        client_reference=reference or f"ref-{payout_id}",
        token=token,
        context=SubmitContext(
            correlation_id=f"corr-{payout_id}",
            causation_id=f"cause-{uuid.uuid4().hex[:8]}",
            deadline_at=datetime.now(UTC) + timedelta(seconds=deadline_s),
        ),
    )


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: connecting is refused."""
    return free_port()


@pytest.fixture
def full_backlog_port() -> Iterator[int]:
    """A listener that never accepts, with its backlog filled: new connects hang (connect timeout).

    Linux drops the SYN of a connection whose listener's accept queue is full, so the client's
    connect() never completes -- the same evidence as an unreachable host: nothing was sent.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # backlog 0 still queues one; fill it, tolerate the rest timing out
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(0.2)
        with contextlib.suppress(OSError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    yield port
    for s in fillers:
        s.close()
    listener.close()


def with_token(req: SubmitRequest, token: int) -> SubmitRequest:
    """The same submission under another token, with that token's genuine grant."""
    grant = GrantIn(**account_grant(req.account_id, token).to_json())
    return req.model_copy(update={"token": token, "grant": grant})
