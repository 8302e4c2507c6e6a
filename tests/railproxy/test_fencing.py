"""The proxy as an enforcement point: fencing (FR-17), the attempt guard (FR-18, FR-23), FR-29."""

from __future__ import annotations

import asyncio
import uuid

import structlog

from railproxy import HandoffCertainty, Outcome, create_app
from tests.rail import Stub
from tests.railproxy.conftest import MakeProxy, Proxy, proxy_settings, submit_request, with_token


async def test_success_records_attempt_with_lineage(proxy: Proxy, stub: Stub) -> None:
    """A clean submission is recorded with adapter and contract versions, then acknowledged."""
    req = submit_request()
    result = await proxy.client.submit(req)
    assert result.outcome is Outcome.ACKED
    assert result.handoff_certainty is HandoffCertainty.ACKNOWLEDGED
    [attempt] = await proxy.client.get_attempts(req.payout_id)
    assert attempt.outcome is Outcome.ACKED
    assert attempt.adapter_version == proxy.settings.adapter_version
    assert attempt.contract_version == proxy.settings.contract_version
    assert attempt.correlation_id == req.context.correlation_id
    assert attempt.token == req.token
    assert len(await stub.movements(req.client_reference)) == 1


async def test_stale_token_is_rejected_before_forwarding(proxy: Proxy, stub: Stub) -> None:
    """A token below the account's high-water mark is refused, nothing recorded or sent."""
    account = f"a-{uuid.uuid4().hex[:8]}"
    first = await proxy.client.submit(submit_request(account_id=account, token=5))
    assert first.outcome is Outcome.ACKED
    stale_req = submit_request(account_id=account, token=4)
    stale = await proxy.client.submit(stale_req)
    assert stale.code == "STALE_TOKEN"
    assert stale.http_status == 409
    assert stale.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert (stale.presented_token, stale.highest_token) == (4, 5)
    assert await proxy.client.get_attempts(stale_req.payout_id) == []
    assert await stub.movements(stale_req.client_reference) == []
    # Equal token = the same grant taking its next step: accepted.
    same = await proxy.client.submit(submit_request(account_id=account, token=5))
    assert same.outcome is Outcome.ACKED
    await stub.assert_no_duplicates()


async def test_negative_control_fencing_disabled_forwards_stale_token(
    make_proxy: MakeProxy, stub: Stub
) -> None:
    """With RAILPROXY_ENFORCE_FENCING=false the stale submit goes through (the check can fail)."""
    proxy = await make_proxy(enforce_fencing=False, experiment_mode=True)
    account = f"a-{uuid.uuid4().hex[:8]}"
    await proxy.client.submit(submit_request(account_id=account, token=5))
    stale_req = submit_request(account_id=account, token=4)
    stale = await proxy.client.submit(stale_req)
    assert stale.outcome is Outcome.ACKED
    assert len(await stub.movements(stale_req.client_reference)) == 1
    [attempt] = await proxy.client.get_attempts(stale_req.payout_id)
    assert attempt.fencing_enforced is False


async def test_duplicate_submission_sequential(proxy: Proxy, stub: Stub) -> None:
    """A second submit of a payout is refused whatever its token; the rail saw one movement."""
    req = submit_request(token=3)
    assert (await proxy.client.submit(req)).outcome is Outcome.ACKED
    again = await proxy.client.submit(with_token(req, 9))
    assert again.code == "DUPLICATE_SUBMISSION"
    assert again.http_status == 409
    assert again.handoff_certainty is HandoffCertainty.NOT_SUBMITTED
    assert len(await proxy.client.get_attempts(req.payout_id)) == 1
    await stub.assert_no_duplicates()


async def _concurrent_submits(proxy: Proxy, n: int) -> tuple[list[str], str]:
    req = submit_request(token=7)
    results = await asyncio.gather(*(proxy.client.submit(req) for _ in range(n)))
    return [r.outcome.value if r.outcome else str(r.code) for r in results], req.client_reference


async def test_duplicate_submission_concurrent(proxy: Proxy, stub: Stub) -> None:
    """N concurrent submits of one payout: exactly one recorded and forwarded, the rest refused."""
    labels, reference = await _concurrent_submits(proxy, 12)
    assert sorted(labels) == ["ACKED"] + ["DUPLICATE_SUBMISSION"] * 11
    assert len(await stub.movements(reference)) == 1
    await stub.assert_no_duplicates()


async def test_negative_control_guard_disabled_pays_twice(
    make_proxy: MakeProxy, stub: Stub
) -> None:
    """With the submission guard off, concurrent submits reach the rail repeatedly (detectable)."""
    proxy = await make_proxy(enforce_submission_guard=False, experiment_mode=True)
    labels, reference = await _concurrent_submits(proxy, 5)
    assert labels == ["ACKED"] * 5
    assert len(await stub.movements(reference)) == 5
    assert (await stub.counts())[reference] == 5  # what assert_no_duplicates would flag


async def test_unknown_outcome_blocks_resubmission_under_any_token(
    proxy: Proxy, stub: Stub
) -> None:
    """FR-23: after a timeout after handoff, even a higher token cannot submit the payout again."""
    await stub.set(rules=[{"reference_prefix": "tafter-", "action": "timeout_after"}])
    req = submit_request(reference=f"tafter-{uuid.uuid4().hex[:8]}", token=1)
    assert (await proxy.client.submit(req)).handoff_certainty is HandoffCertainty.UNKNOWN
    await stub.set(rules=[])
    again = await proxy.client.submit(with_token(req, 100))
    assert again.code == "DUPLICATE_SUBMISSION"
    await stub.assert_no_duplicates()


async def test_disabled_enforcement_is_logged_loudly(rail_db: str, stub: Stub) -> None:
    """Starting with fencing or the guard disabled emits WARNING events naming the switch."""
    app = create_app(
        proxy_settings(
            rail_db,
            stub.url,
            enforce_fencing=False,
            enforce_submission_guard=False,
            experiment_mode=True,
        )
    )
    with structlog.testing.capture_logs() as events:
        async with app.router.lifespan_context(app):
            pass
    names = {(e["event"], e["log_level"]) for e in events}
    assert ("fencing.disabled", "warning") in names
    assert ("submission_guard.disabled", "warning") in names


async def test_enforcement_on_by_default_logs_no_warning(rail_db: str, stub: Stub) -> None:
    """With default settings neither disabled-enforcement event is emitted."""
    app = create_app(proxy_settings(rail_db, stub.url))
    with structlog.testing.capture_logs() as events:
        async with app.router.lifespan_context(app):
            pass
    names = {e["event"] for e in events}
    assert "railproxy.started" in names
    assert not names & {"fencing.disabled", "submission_guard.disabled"}
