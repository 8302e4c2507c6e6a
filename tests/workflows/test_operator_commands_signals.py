"""What a person can send a payout workflow as signals, end to end (issue 24, on the real
Temporal dev server and `temporal` CLI, the real `payouts` console script, PostgreSQL and the
lock server, rail proxy and rail stub as real processes): the rail's evidence outranks an
abandon, two arguments or an undecodable payload are refused and audited and never wedge it, a
forged abandon never displaces a signed one, and an operator assertion is single-use."""

from __future__ import annotations

import json

from temporalio.testing import WorkflowEnvironment

from lockservice.sdk import LockClient
from tests.credentials import OPERATOR, token
from tests.workflows.integration import record
from tests.workflows.operator_tools import (
    RULES,
    ambiguous,
    audit_details,
    payouts,
    temporal,
    temporal_address,
    until,
)
from tests.workflows.system import System, audit_rows, lock_token, signed_command, wait_for
from workflows.payout import PayoutWorkflow

__all__ = ["RULES"]  # the rail stub's, for the `system` fixture (tests/workflows/conftest.py)


#: The test's own acquires of an ambiguous payout's account wait for it: the workflow gives the
#: lock back when it leaves its critical section for the lookups, and on a loaded machine that
#: release can still be in flight when the test asks (a failure detector's bound, no timing).
_FREE_WITHIN_S = 60.0


async def test_evidence_outranks_an_abandon(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """A lookup finds the payout settled while another holder blocks the account's lock: the
    status shows the known resolution and the lookups; an abandon then (Update, and signal) is
    refused naming the evidence, audited for the signal; once the lock is free the payout is
    POSTED, paid once, and never ABANDONED."""
    address = temporal_address(temporal_env)
    payout_id, account_id, handle = await ambiguous(
        temporal_env, system, workers, resolution_sla_s=0.5
    )
    await until(handle, lambda s: s.escalated)
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        blocker = await locks.acquire(f"payout:{account_id}", wait_s=_FREE_WITHIN_S)
        system.stub_set(visibility_delay_s=0)  # the rail now shows it settled
        status = await until(handle, lambda s: s.resolution == "settled")
        assert status.state == "RAIL_AMBIGUOUS" and status.lookups >= 1
        assert status.evidence.startswith("lookup") and status.evidence.endswith("settled")
        assert status.last_lookup is not None and status.last_lookup.status == "settled"

        cli = await payouts(system, address, "payout", "abandon", payout_id, "--reason", "ticket 9")
        assert cli.returncode == 4, cli
        (line,) = cli.stderr.strip().splitlines()
        assert "refused" in line and "rail's evidence" in line and "settled" in line
        await handle.signal("abandon", signed_command(system, "abandon", payout_id, "ticket 9"))
        await until(handle, lambda s: any(c.status == "refused" for c in s.commands))
        # What the operator reads meanwhile, through the console script: the known but not yet
        # applied resolution, the lookups, and the refused commands with their verdicts.
        db = ("--database-url", system.database_url)
        shown = await payouts(system, address, "payout", "status", payout_id, *db, "--json")
        assert shown.returncode == 0, shown
        report = json.loads(shown.stdout)
        assert report["database"]["state"] == "RAIL_AMBIGUOUS"
        assert report["workflow"]["resolution"] == "settled"
        assert report["workflow"]["lookups"] >= 1
        assert any(c["status"] == "refused" for c in report["workflow"]["commands"])
        text = await payouts(system, address, "payout", "status", payout_id, *db)
        assert text.returncode == 0 and "settled" in text.stdout and "refused" in text.stdout, text
        await locks.release(blocker)
    result = await handle.result()
    await record(handle, "commands_evidence_outranks_abandon")
    assert result.state == "POSTED"
    assert len(system.movements(payout_id)) == 1
    assert await audit_rows(system.database_url, payout_id, "abandon") == []
    (refusal,) = await audit_details(system, payout_id, "signal_rejected:abandon")
    assert "rail's evidence" in refusal


async def test_two_arguments_and_undecodable_payloads_never_wedge_a_payout(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """Sent with the real `temporal` CLI: a signal with two arguments and one whose encoding
    no converter knows are each refused and audited, and the workflow goes on looking the
    payout up (lookups keep growing), then posts it once the rail answers."""
    address = temporal_address(temporal_env)
    payout_id, _, handle = await ambiguous(temporal_env, system, workers)
    wid = ["workflow", "signal", "--workflow-id", f"payout-{payout_id}", "--name", "abandon"]
    command = '{"operator": "ana", "reason": "x"}'
    two = await temporal(address, *wid, "--input", command, "--input", command)
    assert two.returncode == 0, two.stderr
    odd = await temporal(address, *wid, "--input", command, "--input-meta", "encoding=binary/odd")
    assert odd.returncode == 0, odd.stderr

    async def both_audited() -> bool:
        return len(await audit_details(system, payout_id, "signal_rejected:abandon")) == 2

    await wait_for(both_audited, timeout_s=60)
    whys = await audit_details(system, payout_id, "signal_rejected:abandon")
    assert any("got 2 arguments" in w for w in whys), whys
    assert any("not decodable" in w and "binary/odd" in w for w in whys), whys
    before = (await handle.query(PayoutWorkflow.status)).lookups
    await until(handle, lambda s: s.lookups >= before + 3)  # not wedged: it goes on
    system.stub_set(visibility_delay_s=0)
    result = await handle.result()
    await record(handle, "commands_malformed_signals")
    assert result.state == "POSTED" and len(system.movements(payout_id)) == 1


async def test_a_forged_abandon_never_displaces_a_signed_one(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """The operator's signed abandon is accepted and waits for the account's lock; an
    uncredentialed one sent after it is refused on its own ("already pending"), audited as an
    unverified claim; the signed one is carried out, audited as the operator."""
    address = temporal_address(temporal_env)
    payout_id, account_id, handle = await ambiguous(
        temporal_env, system, workers, resolution_sla_s=0.5
    )
    await until(handle, lambda s: s.escalated)
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        blocker = await locks.acquire(f"payout:{account_id}", wait_s=_FREE_WITHIN_S)
        await handle.signal("abandon", signed_command(system, "abandon", payout_id, "ticket 7"))
        await until(handle, lambda s: any(c.status == "pending" for c in s.commands))
        forged = '{"operator": "x", "reason": "y"}'
        wid = ["workflow", "signal", "--workflow-id", f"payout-{payout_id}", "--name", "abandon"]
        assert (await temporal(address, *wid, "--input", forged)).returncode == 0
        status = await until(handle, lambda s: any(c.status == "refused" for c in s.commands))
        pending = [c for c in status.commands if c.status == "pending"]
        assert [c.actor for c in pending] == [OPERATOR]
        await locks.release(blocker)
    result = await handle.result()
    await record(handle, "commands_forged_abandon_refused_signed_carried_out")
    assert result.state == "ABANDONED"
    rows = await audit_rows(system.database_url, payout_id, "abandon")
    assert [r["actor"] for r in rows] == [OPERATOR]
    (refused,) = await audit_rows(system.database_url, payout_id, "signal_rejected:abandon")
    assert refused["actor"] == "unverified:x" and "already pending" in refused["details"]
    assert len(system.movements(payout_id)) == 1


async def test_the_abandons_last_lookup_finds_the_evidence_first(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """An abandon accepted while the rail could not tell waits for the account's lock; the rail
    settles meanwhile, and the abandon activity's own last lookup finds it: nothing is
    abandoned, the command ends refused naming the evidence (its one audit row, through
    settle_operator_command), and the payout is POSTED, paid once."""
    payout_id, account_id, handle = await ambiguous(
        temporal_env, system, workers, resolution_sla_s=0.5
    )
    await until(handle, lambda s: s.escalated)
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        blocker = await locks.acquire(f"payout:{account_id}", wait_s=_FREE_WITHIN_S)
        await handle.signal("abandon", signed_command(system, "abandon", payout_id, "ticket 11"))
        await until(handle, lambda s: any(c.status == "pending" for c in s.commands))
        system.stub_set(visibility_delay_s=0)  # the rail now shows it settled
        await locks.release(blocker)
    result = await handle.result()
    await record(handle, "commands_abandon_outranked_by_last_lookup")
    assert result.state == "POSTED"
    (command,) = result.commands
    assert command.status == "refused" and "evidence came first" in command.why, command
    assert await audit_rows(system.database_url, payout_id, "abandon") == []
    assert len(system.movements(payout_id)) == 1


async def test_an_operator_assertion_is_single_use(
    temporal_env: WorkflowEnvironment, system: System, workers: str, lagging_rail: None
) -> None:
    """A signed revoke is carried out; the very same command, copied from the payout's history
    and sent again (within its lifetime), is refused as `replayed`: the lock was revoked once,
    and the holder that took it next keeps its grant."""
    address = temporal_address(temporal_env)
    payout_id, account_id, handle = await ambiguous(temporal_env, system, workers)
    key = f"payout:{account_id}"
    async with LockClient(system.lock_url, ttl_s=30.0, token=token("worker")) as locks:
        first = await locks.acquire(key, wait_s=_FREE_WITHIN_S)
        command = signed_command(system, "revoke", payout_id, "stuck holder", account_id)
        await handle.signal("revoke", command)
        await until(handle, lambda s: any(c.status == "carried_out" for c in s.commands))
        second = await locks.acquire(key, wait_s=10)  # the account's next holder
        assert second.token > first.token
        copied = _signal_payload(await handle.fetch_history(), "revoke")
        wid = ["workflow", "signal", "--workflow-id", f"payout-{payout_id}", "--name", "revoke"]
        assert (await temporal(address, *wid, "--input", copied)).returncode == 0
        status = await until(handle, lambda s: any(c.status == "refused" for c in s.commands))
        (refused,) = [c for c in status.commands if c.status == "refused"]
        assert "already used" in refused.why
        assert lock_token(system, key) == second.token  # not revoked a second time
        await locks.release(second)
    revokes = await audit_rows(system.database_url, payout_id, "lock_revoke_requested")
    assert len(revokes) == 1 and json.loads(revokes[0]["details"])["revoked_token"] == first.token
    system.stub_set(visibility_delay_s=0)
    assert (await handle.result()).state == "POSTED"
    await record(handle, "commands_revoke_then_replay_refused")


def _signal_payload(history: object, name: str) -> str:
    """The JSON of the first `name` signal in a history, as anyone reading it could copy it."""
    for event in history.events:  # type: ignore[attr-defined]
        if event.HasField("workflow_execution_signaled_event_attributes"):
            attrs = event.workflow_execution_signaled_event_attributes
            if attrs.signal_name == name:
                return str(attrs.input.payloads[0].data.decode())
    raise AssertionError(f"no {name} signal in the history")
