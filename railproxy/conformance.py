"""Reusable rail-connection conformance suite (STD01-14), against the rail stub as simulator.

A rail connection is anything with `submit(SubmitRequest) -> SubmitResult` and
`lookup(client_reference) -> LookupResponse` (e.g. `railproxy.client.RailProxyClient` in front of
a proxy). A test module supplies a `Harness`: a factory that builds a connection for a given rail
URL, the simulator's admin surface, and an address where nothing answers. Each check is an async
function of the harness; `CHECKS` maps scenario names to them, ready for `pytest.mark.parametrize`.

The contract checked, scenario by scenario:
- success: ACKNOWLEDGED, one movement at the rail.
- business rejection: FINAL (DECLINED), lookup says declined.
- timeout before handoff (rail unreachable): NOT_SUBMITTED, nothing at the rail.
- timeout before handoff (rail stalls before recording): anything but NOT_SUBMITTED -- the
  connection cannot know nothing happened -- and the lookup resolves it to not_found.
- timeout after possible handoff: UNKNOWN, and the lookup finds the movement.
- delayed completion: ACKNOWLEDGED as pending, lookup later says settled.
- duplicate (sequential and concurrent): the rail sees the payout once.
- provider unavailable: NOT_SUBMITTED, nothing at the rail.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from railproxy.client import SubmitResult
from railproxy.models import (
    HandoffCertainty,
    LookupResponse,
    Outcome,
    SubmitContext,
    SubmitRequest,
)


class RailConnection(Protocol):
    async def submit(self, req: SubmitRequest) -> SubmitResult: ...

    async def lookup(self, client_reference: str) -> LookupResponse: ...


class Simulator(Protocol):
    """The rail stub's admin surface (see railstub: /admin/behaviour, /admin/movements)."""

    async def set(self, **behaviour: Any) -> None: ...

    async def movements(self, client_reference: str | None = None) -> list[dict[str, Any]]: ...


@dataclass
class Harness:
    connect: Callable[[str], Awaitable[RailConnection]]  # rail URL -> connection under test
    simulator: Simulator
    simulator_url: str
    unreachable_url: str  # connecting there is refused or never completes


def request(
    reference_prefix: str = "conf-", *, amount: int = 1000, token: int = 1, deadline_s: float = 5.0
) -> SubmitRequest:
    uid = uuid.uuid4().hex[:12]
    return SubmitRequest(
        payout_id=f"conf-p-{uid}",
        account_id=f"conf-a-{uid}",
        amount=amount,
        client_reference=f"{reference_prefix}{uid}",
        token=token,
        context=SubmitContext(
            correlation_id=f"conf-c-{uid}",
            causation_id=f"conf-x-{uid}",
            deadline_at=datetime.now(UTC) + timedelta(seconds=deadline_s),
        ),
    )


async def _moved(h: Harness, req: SubmitRequest) -> int:
    return len(await h.simulator.movements(req.client_reference))


async def _eventually(
    conn: RailConnection, reference: str, status: str, timeout_s: float = 10.0
) -> None:
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = (await conn.lookup(reference)).status
        if seen == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"lookup of {reference} stayed {seen!r}, expected {status!r}")


async def check_success(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    req = request()
    result = await conn.submit(req)
    assert result.handoff_certainty is HandoffCertainty.ACKNOWLEDGED, result
    assert await _moved(h, req) == 1


async def check_business_rejection(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    await h.simulator.set(rules=[{"reference_prefix": "conf-decl-", "action": "decline"}])
    req = request("conf-decl-")
    result = await conn.submit(req)
    assert (result.outcome, result.handoff_certainty) == (
        Outcome.DECLINED,
        HandoffCertainty.FINAL,
    ), result
    await _eventually(conn, req.client_reference, "declined")


async def check_timeout_before_handoff_unreachable(h: Harness) -> None:
    conn = await h.connect(h.unreachable_url)
    req = request()
    result = await conn.submit(req)
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED, result
    assert await _moved(h, req) == 0


async def check_timeout_before_handoff_stall(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    await h.simulator.set(rules=[{"reference_prefix": "conf-tb-", "action": "timeout_before"}])
    req = request("conf-tb-")
    result = await conn.submit(req)
    # The bytes were sent: claiming NOT_SUBMITTED here would license a second payment.
    assert result.handoff_certainty is HandoffCertainty.UNKNOWN, result
    assert await _moved(h, req) == 0
    await _eventually(conn, req.client_reference, "not_found")


async def check_timeout_after_possible_handoff(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    await h.simulator.set(rules=[{"reference_prefix": "conf-ta-", "action": "timeout_after"}])
    req = request("conf-ta-")
    result = await conn.submit(req)
    assert result.handoff_certainty is HandoffCertainty.UNKNOWN, result
    assert await _moved(h, req) == 1
    await _eventually(conn, req.client_reference, "settled")


async def check_delayed_completion(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    await h.simulator.set(rules=[{"reference_prefix": "conf-dl-", "action": "delayed"}])
    req = request("conf-dl-")
    result = await conn.submit(req)
    assert result.handoff_certainty is HandoffCertainty.ACKNOWLEDGED, result
    assert result.rail_status == "pending"
    await _eventually(conn, req.client_reference, "settled")


async def check_duplicate_sequential(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    req = request()
    await conn.submit(req)
    again = await conn.submit(req.model_copy(update={"token": req.token + 1}))
    assert again.handoff_certainty is HandoffCertainty.NOT_SUBMITTED, again
    assert await _moved(h, req) == 1


async def check_duplicate_concurrent(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    req = request()
    results = await asyncio.gather(*(conn.submit(req) for _ in range(8)))
    assert sum(r.outcome is Outcome.ACKED for r in results) == 1, results
    assert await _moved(h, req) == 1


async def check_provider_unavailable(h: Harness) -> None:
    conn = await h.connect(h.simulator_url)
    await h.simulator.set(outage=True)
    try:
        req = request()
        result = await conn.submit(req)
    finally:
        await h.simulator.set(outage=False)
    assert result.handoff_certainty is HandoffCertainty.NOT_SUBMITTED, result
    assert await _moved(h, req) == 0


CHECKS: dict[str, Callable[[Harness], Awaitable[None]]] = {
    "success": check_success,
    "business_rejection": check_business_rejection,
    "timeout_before_handoff_unreachable": check_timeout_before_handoff_unreachable,
    "timeout_before_handoff_stall": check_timeout_before_handoff_stall,
    "timeout_after_possible_handoff": check_timeout_after_possible_handoff,
    "delayed_completion": check_delayed_completion,
    "duplicate_sequential": check_duplicate_sequential,
    "duplicate_concurrent": check_duplicate_concurrent,
    "provider_unavailable": check_provider_unavailable,
}
