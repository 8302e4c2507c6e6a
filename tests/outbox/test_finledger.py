"""The finance ledger stand-in over real HTTP: its answers, injected faults and its evidence."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.outbox.conftest import FinLedger


def body(amount: int = 100, account_id: str = "acct-1") -> dict[str, object]:
    return {
        "event_id": "e-1",
        "event_type": "ledger.posted",
        "account_id": account_id,
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "contract_version": "paydb.v1",
        "payload": {"amount": amount, "account_id": account_id},
    }


async def test_created_duplicate_conflict(finledger: FinLedger) -> None:
    """Same id + same content is a duplicate (200), different content a conflict (409); one record."""
    first = await finledger.write("acct-1:po-1:g-1", body())
    again = await finledger.write("acct-1:po-1:g-1", body() | {"event_id": "e-other"})
    other = await finledger.write("acct-1:po-1:g-1", body(amount=999))
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json()["status"] == "duplicate"
    records = await finledger.records()
    assert len(records) == 1 and records[0]["payload"]["amount"] == 100
    # negative control: a different id is a second record
    assert (await finledger.write("acct-1:po-2:g-2", body())).status_code == 201
    assert await finledger.count() == 2


async def test_unknown_account_is_404_and_records_nothing(finledger: FinLedger) -> None:
    """An account absent from finance's chart answers 404 and nothing is recorded."""
    await finledger.set_faults(unknown_account_prefixes=["ghost-"])
    r = await finledger.write("ghost-1:po:g", body(account_id="ghost-1"))
    assert r.status_code == 404 and r.json()["code"] == "UNKNOWN_ACCOUNT"
    assert await finledger.count() == 0
    assert (await finledger.write("acct-1:po:g", body())).status_code == 201


async def test_rules_fail_then_accept_and_down_switch(finledger: FinLedger) -> None:
    """A `times` rule fails that many matching writes with its status, then the write succeeds."""
    await finledger.set_faults(
        rules=[{"correlation_prefix": "acct-1:", "status": 503, "times": 2, "action": "fail"}]
    )
    codes = [(await finledger.write("acct-1:po:g", body())).status_code for _ in range(3)]
    assert codes == [503, 503, 201]
    await finledger.set_faults(down=True)
    assert (await finledger.write("acct-2:po:g", body(account_id="acct-2"))).status_code == 503
    assert (await finledger.call("GET", "/health")).status_code == 503
    assert await finledger.count() == 1


@pytest.mark.parametrize(("action", "recorded"), [("drop", 0), ("drop_after_record", 1)])
async def test_dropped_connection(finledger: FinLedger, action: str, recorded: int) -> None:
    """A drop rule closes the connection with no answer; `drop_after_record` records first."""
    await finledger.set_faults(
        rules=[{"correlation_prefix": "acct-1:", "action": action, "times": 1}]
    )
    with pytest.raises(httpx.RemoteProtocolError):
        await finledger.write("acct-1:po:g", body())
    assert await finledger.count() == recorded
    retry = await finledger.write("acct-1:po:g", body())
    assert retry.status_code == (201 if recorded == 0 else 200)


async def test_latency_rule_and_request_history(finledger: FinLedger) -> None:
    """Latency set at run time holds a write in flight, which the request history shows."""
    await finledger.set_faults(latency_s=0.3)
    task = asyncio.create_task(finledger.write("acct-1:po:g", body()))
    while (await finledger.requests())["in_flight"] == 0:
        await asyncio.sleep(0.01)
    assert (await finledger.count()) == 0  # not yet recorded while in flight
    assert (await task).status_code == 201
    history = await finledger.requests()
    assert history["in_flight"] == 0 and history["counts"] == {"acct-1:po:g": 1}
    assert history["requests"][0]["answer"] == "created"


async def test_bad_body_is_422(finledger: FinLedger) -> None:
    """A malformed record is refused (422, a permanent answer) and nothing is recorded."""
    r = await finledger.write("acct-1:po:g", {"event_id": "x"})
    assert r.status_code == 422
    assert await finledger.count() == 0
