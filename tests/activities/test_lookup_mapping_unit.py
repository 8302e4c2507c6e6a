"""UNIT tests of lookup_rail's mapping (activities/payout/lookups.py), with a MOCK proxy
client: the worker passes the payout to the proxy and maps its verdict; "absent" comes only from
the proxy's proven `absent`, never from the worker's clock or the rail's raw `not_found`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from temporalio.testing import ActivityEnvironment

from activities import models as m
from activities.payout_activities import PayoutActivities
from railproxy.errors import LookupUnavailable
from railproxy.models import LookupResponse

LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


class MockProxy:
    """Answers every lookup with `answer` (or raises it) and remembers what it was asked."""

    def __init__(self, answer: LookupResponse | Exception) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str | None]] = []

    async def lookup(self, client_reference: str, payout_id: str | None = None) -> LookupResponse:
        self.calls.append((client_reference, payout_id))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def get_attempts(self, payout_id: str) -> list[Any]:
        raise AssertionError("lookup_rail must not judge absence from attempts itself")


def _found(status: str, *, absent: bool = False, reason: str = "") -> LookupResponse:
    # A window that, by the worker's clock, is far past any deadline: it must not matter.
    now = datetime.now(UTC)
    return LookupResponse(
        client_reference="ref-1",
        status=status,  # type: ignore[arg-type]
        observed_at=now,
        complete_from=LONG_AGO,
        complete_through=now + timedelta(days=365),
        absent=absent,
        reason=reason,
    )


async def _lookup(answer: LookupResponse | Exception) -> tuple[m.LookupResult, MockProxy]:
    proxy = MockProxy(answer)
    acts = PayoutActivities(
        locks=cast(Any, None),
        store=cast(Any, None),
        proxy=cast(Any, proxy),
        worker_queue="q-holder-test",
        worker_id="test",
        lock_url="http://lock",
    )
    req = m.LookupRequest(
        payout_id="p-1", client_reference="ref-1", context=m.WorkContext(correlation_id="c")
    )
    result = await ActivityEnvironment().run(acts.lookup_rail, req)
    return result, proxy


@pytest.mark.parametrize("status", ["settled", "pending", "declined"])
async def test_unit_rail_statuses_pass_through(status: str) -> None:
    result, proxy = await _lookup(_found(status))
    assert result.status == status
    assert proxy.calls == [("ref-1", "p-1")]  # the proxy judges by the payout's attempts


async def test_unit_not_found_is_absent_only_when_the_proxy_proved_it() -> None:
    unproven, _ = await _lookup(_found("not_found", reason="not yet past the margins"))
    proven, _ = await _lookup(_found("not_found", absent=True, reason="covered"))
    assert (unproven.status, unproven.detail) == ("pending", "not yet past the margins")
    assert (proven.status, proven.detail) == ("absent", "covered")


async def test_unit_unavailable_lookup_is_reported_not_raised() -> None:
    result, _ = await _lookup(LookupUnavailable("rail down"))
    assert result.status == "unavailable"
