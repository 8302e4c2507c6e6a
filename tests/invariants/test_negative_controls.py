"""The checker on the real system: a clean run reports ten zeros, and one negative control per
invariant (NFR-07) breaks exactly that invariant and is reported as exactly that (or, where one
fact breaks two invariants, e.g. a posted payout paid twice is INV-02 and INV-09, exactly those)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from structlog.testing import capture_logs
from temporalio.testing import WorkflowEnvironment

from activities.models import PayoutInput
from invariants.checker import InvariantReport, temporal_workflow_source
from ledger import FencedOut, PayoutStore
from tests.invariants.conftest import AMBIGUOUS, DECLINE, World, lock_key, sample_of, violated
from workflows.payout import PayoutWorkflow

ALL = {f"INV-{i:02d}" for i in range(1, 11)}


async def test_clean_run_reports_ten_zeros(world: World) -> None:
    """Posted, declined, ambiguous-then-settled, unfunded, already-advanced and fenced-out work
    leaves every invariant at zero, with one `invariants.checked` event and no violation event."""
    a, b = await world.account(), await world.account(funds=100)
    await world.pay(a, 1000)
    await world.pay(a, DECLINE)
    ambiguous = await world.pay(a, AMBIGUOUS)
    await world.pay(b, 500)  # insufficient funds: FAILED at claim, no rail call
    # The ambiguity is resolved (settled at the rail) and posted later under a newer grant.
    g = await world.grant(a)
    await world.store.resolve_settled(ambiguous, g.token, world.ctx)
    await world.store.post(ambiguous, g.token, world.ctx)
    # A late duplicate claim finds the payout already advanced: it stamps the balance, no audit.
    await world.store.claim(ambiguous, g.token, world.ctx)
    await world.locks.release(g)
    # A stale holder is fenced out: a rejected write is not a violation, a landed one would be.
    stale = await world.grant(a)
    late = await world.new_payout(a, 300)
    await world.store.claim(late, stale.token, world.ctx)
    await world.locks.release(stale)
    fresh = await world.grant(a)
    await world.store.mark_submitted(late, fresh.token, world.ctx)
    await world.locks.release(fresh)
    with pytest.raises(FencedOut):
        await world.store.mark_acked(late, stale.token, world.ctx)

    with capture_logs() as events:
        report = await world.check()
    assert report.ok and report.counts() == dict.fromkeys(sorted(ALL), 0)
    assert report.checked["payouts"] == 5 and report.checked["grants"] == 7
    assert report.checked["movements"] == 3 and report.checked["attempts"] == 3
    names = [e["event"] for e in events]
    assert names.count("invariants.checked") == 1 and "invariants.violation" not in names


async def test_inv01_a_lower_token_write_after_a_higher_one_on_the_account(world: World) -> None:
    """The account's writes go backwards: a write recorded under a token below one the account
    had already seen (evidence inserted directly; the real store refuses to produce it)."""
    a = await world.account()
    first = await world.new_payout(a, 1000)
    second = await world.new_payout(a, 1000)
    old = await world.grant(a)
    await world.store.claim(first, old.token, world.ctx)
    await world.locks.release(old)
    new = await world.grant(a)
    await world.store.claim(second, new.token, world.ctx)
    await world.locks.release(new)
    await world.execute(
        "INSERT INTO paydb.audit_log (actor, token, action, payout_id, account_id, from_state,"
        f" to_state) VALUES ('stale-worker', {int(old.token)}, 'mark_submitted', '{first}',"
        f" '{a}', 'CLAIMED', 'RAIL_SUBMITTED')"
    )

    with capture_logs() as events:
        report = await world.check()
    assert violated(report) == {"INV-01"}
    [only] = sample_of(report, "INV-01")
    assert only.startswith(f"account {a} audit#")
    assert only.endswith(f"token={old.token} after token={new.token} on the account")
    violations = [e for e in events if e["event"] == "invariants.violation"]
    assert [(e["invariant"], e["count"]) for e in violations] == [("INV-01", 1)]


async def test_inv01_superseded_holder_before_the_new_holder_writes_is_ordered(
    world: World,
) -> None:
    """Boundary: a holder superseded at the lock service lands a write before the new holder has
    presented its token anywhere. No resource can refuse it, and it is ordered before every
    write of the new holder, so INV-01 holds; once the new holder writes, the old is refused."""
    a = await world.account()
    payout_id = await world.new_payout(a, 1000)
    old = await world.grant(a)
    await world.store.claim(payout_id, old.token, world.ctx)
    await world.locks.release(old)
    new = await world.grant(a)
    await world.store.mark_submitted(payout_id, old.token, world.ctx)  # lands: nobody saw `new`
    await world.store.mark_acked(payout_id, new.token, world.ctx)
    with pytest.raises(FencedOut):
        await world.store.mark_ambiguous(payout_id, old.token, world.ctx)
    await world.locks.release(new)
    report = await world.check()
    assert report.ok, report.as_dict()


async def test_inv02_second_rail_movement_for_one_payout(world: World) -> None:
    """A second instruction for an already paid reference reaches the rail (bypassing the proxy)."""
    a = await world.account()
    payout_id = await world.pay(a, 1000)
    await world.stub_payment(payout_id, a)
    report = await world.check()
    # The same fact breaks INV-09: the ledger booked one payment, the rail moved two.
    assert violated(report) == {"INV-02", "INV-09"}
    assert sample_of(report, "INV-02") == [f"{payout_id}: 2 rail movements"]
    assert sample_of(report, "INV-09") == [
        f"{payout_id} is POSTED with 2 rail movement(s) that moved money"
    ]


async def test_inv02_two_decided_attempts_for_one_payout(world: World) -> None:
    """With the proxy's submission guard switched off, one payout gets two ACKED attempts (and,
    the real evidence, two rail movements)."""
    a = await world.account()
    payout_id = await world.pay(a, 1000)
    g = await world.grant(a)
    unguarded = world.start_proxy(enforce_submission_guard=False)
    try:
        assert await world.submit(payout_id, a, 1000, g.token, proxy=unguarded) == "ACKED"
    finally:
        await unguarded.aclose()
        await world.locks.release(g)
    report = await world.check()
    assert violated(report) == {"INV-02", "INV-09"}  # POSTED once, paid twice: both
    assert sample_of(report, "INV-02") == [
        f"{payout_id}: 2 decided attempts",
        f"{payout_id}: 2 rail movements",
    ]


async def test_inv03_unbalanced_group(world: World) -> None:
    """A ledger group whose entries do not sum to zero (the deferred balance trigger disabled)."""
    a = await world.account()
    await world.pay(a, 1000)
    group_id = uuid.uuid4()
    await world.execute(
        # The deferred constraint triggers would refuse this COMMIT; switch them off to land it.
        "ALTER TABLE paydb.ledger_entries DISABLE TRIGGER ledger_entries_balanced",
        "ALTER TABLE paydb.ledger_groups DISABLE TRIGGER ledger_groups_balanced",
        "INSERT INTO paydb.ledger_groups (group_id, kind, correlation_id)"
        f" VALUES ('{group_id}', 'funding', 'broken')",
        "INSERT INTO paydb.ledger_entries (group_id, account_id, amount)"
        f" VALUES ('{group_id}', '{a}', 5), ('{group_id}', 'funding_source', -4)",
        "ALTER TABLE paydb.ledger_entries ENABLE TRIGGER ledger_entries_balanced",
        "ALTER TABLE paydb.ledger_groups ENABLE TRIGGER ledger_groups_balanced",
    )
    report = await world.check()
    assert violated(report) == {"INV-03"}
    assert f"group {group_id}" in sample_of(report, "INV-03")


async def test_inv04_repeated_token(world: World) -> None:
    """The lock history shows a token issued again after it was used (a restore without the
    epoch bump): the unique index is dropped in this test database to let the row in."""
    a = await world.account()
    await world.pay(a, 1000)
    token = (await world.locks.inspect(lock_key(a))).last_token
    await world.execute(
        "DROP INDEX lockservice.grant_history_key_token_idx",
        "INSERT INTO lockservice.grant_history"
        " (key, token, session_id, acquired_at, ended_at, end_reason)"
        f" VALUES ('{lock_key(a)}', {token}, '{uuid.uuid4()}', clock_timestamp(),"
        "         clock_timestamp() + interval '1 ms', 'released')",
    )
    report = await world.check()
    assert violated(report) == {"INV-04"}
    assert sample_of(report, "INV-04") == [
        f"{lock_key(a)} token={token} issued after token={token}"
    ]


async def test_inv05_lower_token_attempt_at_the_proxy(world: World) -> None:
    """A proxy with fencing switched off records an attempt under a token below one it has
    already recorded for the account (the paydb rows are untouched: only INV-05)."""
    a = await world.account()
    first, second = await world.new_payout(a, 1000), await world.new_payout(a, 2000)
    old = await world.grant(a)
    await world.locks.release(old)
    new = await world.grant(a)
    await world.locks.release(new)
    assert await world.submit(first, a, 1000, new.token) == "ACKED"
    unfenced = world.start_proxy(enforce_fencing=False)
    try:
        assert await world.submit(second, a, 2000, old.token, proxy=unfenced) == "ACKED"
    finally:
        await unfenced.aclose()
    report = await world.check()
    assert violated(report) == {"INV-05"}
    assert sample_of(report, "INV-05")[0].startswith(f"proxy {a} attempt#")


async def test_inv05_balance_fence_lowered(world: World) -> None:
    """A balance row's stored fence lowered below the highest token that wrote it."""
    a = await world.account()
    await world.pay(a, 1000)
    await world.execute(f"UPDATE paydb.balances SET fence = 0 WHERE account_id = '{a}'")
    report = await world.check()
    assert violated(report) == {"INV-05"}
    assert sample_of(report, "INV-05")[0].startswith(f"balance {a} fence=0 < highest write")


async def test_inv05_and_inv01_write_under_a_lower_token(world: World) -> None:
    """The UC-03 case with paydb fencing off: the stale holder's write lands after the newer
    holder wrote. The same fact breaks INV-05 (the fence went back) and INV-01 (a write under a
    token that was no longer the highest), so exactly those two are reported."""
    a = await world.account()
    payout_id = await world.new_payout(a, 1000)
    old = await world.grant(a)
    await world.store.claim(payout_id, old.token, world.ctx)
    await world.locks.release(old)
    new = await world.grant(a)
    await world.store.mark_submitted(payout_id, new.token, world.ctx)
    await world.locks.release(new)
    unfenced = PayoutStore(world.pool, enforce_fencing=False)
    await unfenced.mark_ambiguous(payout_id, old.token, world.ctx)  # lands, fence back to old
    report = await world.check()
    assert violated(report) == {"INV-01", "INV-05"}
    inv05 = sample_of(report, "INV-05")
    assert f"payout {payout_id} fence={old.token} != highest write {new.token}" in inv05


async def test_inv06_overlapping_grants(world: World) -> None:
    """A second grant for a key starts while the first is still valid."""
    a = await world.account()
    held = await world.grant(a)  # valid, open-ended
    await world.execute(
        "INSERT INTO lockservice.grant_history"
        " (key, token, session_id, acquired_at, ended_at, end_reason)"
        f" VALUES ('{lock_key(a)}', {held.token + 1}, '{uuid.uuid4()}', clock_timestamp(),"
        "         clock_timestamp() + interval '1 s', 'released')",
    )
    report = await world.check()
    await world.locks.release(held)
    assert violated(report) == {"INV-06"}
    assert sample_of(report, "INV-06") == [
        f"{lock_key(a)} token={held.token + 1} overlaps token={held.token}"
    ]


async def test_inv07_side_effects_without_a_grant(world: World) -> None:
    """A proxy attempt and a fenced paydb write present a token never issued for the account."""
    a = await world.account()
    submitted, claimed = await world.new_payout(a, 1000), await world.new_payout(a, 2000)
    assert await world.submit(submitted, a, 1000, 999) == "ACKED"
    await world.store.claim(claimed, 555, world.ctx)
    report = await world.check()
    assert violated(report) == {"INV-07"}
    sample = sample_of(report, "INV-07")
    assert len(sample) == 2
    assert any(s.startswith("attempt#") and submitted in s and "token=999" in s for s in sample)
    assert any(s.startswith("audit#") and "claim token=555" in s for s in sample)


async def test_inv08_transition_out_of_a_terminal_state(world: World) -> None:
    """A POSTED payout moved back to CLAIMED (the payouts trigger disabled in this database)."""
    a = await world.account()
    payout_id = await world.pay(a, 1000)
    await world.execute(
        # payouts_guard refuses any change of a terminal row; switch it off to land one.
        "ALTER TABLE paydb.payouts DISABLE TRIGGER payouts_guard",
        f"UPDATE paydb.payouts SET state = 'CLAIMED' WHERE payout_id = '{payout_id}'",
        "ALTER TABLE paydb.payouts ENABLE TRIGGER payouts_guard",
    )
    report = await world.check()
    assert violated(report) == {"INV-08"}
    assert sample_of(report, "INV-08") == [f"{payout_id} is CLAIMED after terminal POSTED"]


async def test_inv09_failed_payout_whose_money_the_rail_moved(world: World) -> None:
    """The unsound "absent": the real stub recorded and settled the instruction (then answered
    500, so the payout went RAIL_AMBIGUOUS) and a resolution through the real store declares it
    absent, FAILED. The beneficiary is paid while our records say nothing moved."""
    a = await world.account()
    payout_id = await world.pay(a, AMBIGUOUS)
    g = await world.grant(a)
    await world.store.resolve_absent(payout_id, g.token, world.ctx)
    await world.locks.release(g)
    report = await world.check()
    assert violated(report) == {"INV-09"}
    assert sample_of(report, "INV-09") == [
        f"{payout_id} is FAILED but the rail moved money 1 time(s)"
    ]


async def test_inv09_posted_payout_the_rail_has_no_record_of(world: World) -> None:
    """The rail loses its movement log (the admin reset clears it: the loss a rail without a
    durable log suffers on restart, as the stub did before issue 12): a POSTED payout then has
    no movement behind it."""
    a = await world.account()
    payout_id = await world.pay(a, 1000)
    await world.stub.reset()
    report = await world.check()
    assert violated(report) == {"INV-09"}
    assert sample_of(report, "INV-09") == [
        f"{payout_id} is POSTED with 0 rail movement(s) that moved money"
    ]


async def test_inv10_an_unescalated_ambiguous_payout_is_stranded_once_settled(
    world: World,
) -> None:
    """Settled, an ambiguous payout must be escalated (an operator owns it); until then it is
    INV-10. Mid-run (not settled) the same evidence is not a violation. The escalation is the
    audit row the real escalate activity writes through the store."""
    a = await world.account()
    payout_id = await world.pay(a, AMBIGUOUS)
    assert (await world.check()).ok
    report = await world.check(settled=True)
    assert violated(report) == {"INV-10"}
    assert sample_of(report, "INV-10") == [
        f"{payout_id} is RAIL_AMBIGUOUS after settling (not escalated)"
    ]
    await world.store.record_audit(
        actor="inv-test-worker", action="ambiguity_escalated", payout_id=payout_id, account_id=a
    )
    settled = await world.check(settled=True)
    assert settled.ok and settled.not_checked == [
        "INV-10 closed workflows (no Temporal address given)"
    ]


async def _check_until(
    world: World, address: str, want: int, within_s: float = 30.0
) -> InvariantReport:
    """Temporal's visibility store is eventually consistent: poll for the recorded fact."""
    deadline = time.monotonic() + within_s
    while True:
        report = await world.check(workflows=temporal_workflow_source(address))
        count = report.counts()["INV-10"]
        if count >= want or time.monotonic() > deadline:
            return report
        await asyncio.sleep(0.2)


async def test_inv10_a_terminated_workflow_strands_its_open_payout(
    world: World, temporal_env: WorkflowEnvironment
) -> None:
    """A real PayoutWorkflow is terminated with the real Temporal client while its payout is
    PENDING: nothing will ever move that payout again (one workflow per payout, ever). The
    checker finds it through Temporal even mid-run; a terminated workflow of a POSTED payout is
    not a violation."""
    client = temporal_env.client
    address = client.service_client.config.target_host
    a = await world.account()
    stranded = await world.new_payout(a, 1000)
    finished = await world.pay(a, 1200)
    # No worker polls this queue: the workflows wait for their first task until terminated.
    queue = f"inv10-{uuid.uuid4().hex[:8]}"
    for payout_id in (stranded, finished):
        handle = await client.start_workflow(
            PayoutWorkflow.run,
            PayoutInput(payout_id=payout_id, account_id=a, correlation_id=payout_id),
            id=f"payout-{payout_id}",
            task_queue=queue,
        )
        await handle.terminate(reason="invariant checker negative control")
    report = await _check_until(world, address, want=1)
    assert violated(report) == {"INV-10"}
    assert sample_of(report, "INV-10") == [
        f"workflow payout-{stranded} is TERMINATED while the payout is PENDING"
    ]
    assert report.checked["closed_workflows"] >= 2
