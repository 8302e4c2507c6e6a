"""The publisher as a real process (`payouts outbox run`): SIGKILL mid-delivery and restart; and
the operator commands `payouts outbox list|retry|discard`, audited."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg

from common.credentials import Kind, issue_tokens, write_credentials
from common.db_roles import OUTBOX
from ledger import PayoutStore, WorkContext
from tests.conftest import as_role
from tests.outbox.conftest import (
    FinLedger,
    MakePublisher,
    new_account,
    outbox_rows,
    post_payout,
    wait_for,
)

PAYOUTS = [str(Path(sys.executable).parent / "payouts")]


def publisher_env(db: str, ledger_url: str) -> dict[str, str]:
    return os.environ | {
        "OUTBOX_DATABASE_URL": as_role(db, OUTBOX),  # the publisher's own role
        "OUTBOX_FINLEDGER_URL": ledger_url,
        "OUTBOX_HTTP_TIMEOUT_S": "1.5",
        "OUTBOX_LEASE_S": "3",
        "OUTBOX_POLL_INTERVAL_S": "0.1",
        "OUTBOX_BATCH_SIZE": "5",
        "OUTBOX_BASE_DELAY_S": "0.05",
        "OUTBOX_MAX_DELAY_S": "0.2",
    }


async def test_publisher_killed_mid_delivery_then_restarted(
    pool: asyncpg.Pool,
    outbox_db: str,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    run_dir: Path,
) -> None:
    """SIGKILL while deliveries are in flight, restart: exactly one downstream record per row."""
    account = await new_account(store, ctx)
    for _ in range(4):
        await post_payout(store, ctx, account)
    await finledger.set_faults(latency_s=1.0)
    env = publisher_env(outbox_db, finledger.url)
    log = (run_dir / "outbox-kill.log").open("w")
    first = await asyncio.create_subprocess_exec(
        *PAYOUTS, "outbox", "run", env=env, stdout=log, stderr=log
    )
    try:

        async def in_flight() -> bool:
            return bool((await finledger.requests())["in_flight"] > 0)

        await wait_for(in_flight)
        first.send_signal(signal.SIGKILL)
        await asyncio.wait_for(first.wait(), timeout=10)
        in_flight_keys = {
            r["correlation_id"]
            for r in (await finledger.requests())["requests"]
            if r["finished"] is None
        }
        claimed = await outbox_rows(pool, "claimed_by IS NOT NULL AND status = 'pending'")
        assert in_flight_keys and in_flight_keys <= {r["delivery_key"] for r in claimed}
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()
    await finledger.set_faults(latency_s=0.0)
    second = await asyncio.create_subprocess_exec(
        *PAYOUTS, "outbox", "run", env=env, stdout=log, stderr=log
    )
    try:

        async def all_delivered() -> bool:
            return all(r["status"] == "delivered" for r in await outbox_rows(pool))

        await wait_for(all_delivered, timeout_s=60)
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), timeout=15)
        log.close()
    assert second.returncode == 0  # graceful stop on SIGTERM
    rows = await outbox_rows(pool)
    records = await finledger.records()
    assert sorted(r["correlation_id"] for r in records) == sorted(r["delivery_key"] for r in rows)
    counts = (await finledger.requests())["counts"]
    assert all(counts[k] >= 2 for k in in_flight_keys)  # really sent again after the kill
    resent = [r for r in rows if r["delivery_key"] in in_flight_keys]
    assert {r["last_outcome"] for r in resent} <= {"completed", "duplicate_completed"}


_KINDS: dict[str, Kind] = {"alice": "operator", "bob": "operator", "outbox": "component"}


@functools.cache
def _operators() -> tuple[dict[str, Path], Path]:
    """Operator token files and the digests `payouts outbox` checks them against."""
    base = Path(tempfile.mkdtemp(prefix="outbox-creds-"))
    tokens = issue_tokens(base / "tokens", _KINDS)
    return tokens, write_credentials(base / "outbox-cli.json", _KINDS, tokens)


def cli(db: str, *args: str, who: str | None = "alice") -> subprocess.CompletedProcess[str]:
    """`payouts outbox ARGS` as operator `who` (its token file; None: no token at all)."""
    tokens, creds = _operators()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYOUTS_OPERATOR_TOKEN")}
    env["OUTBOX_CREDENTIALS_PATH"] = str(creds)
    if who is not None:
        env["PAYOUTS_OPERATOR_TOKEN_FILE"] = str(tokens[who])
    return subprocess.run(
        [*PAYOUTS, "outbox", *args, "--database-url", as_role(db, OUTBOX)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


async def test_operator_list_retry_discard_are_audited(
    pool: asyncpg.Pool,
    outbox_db: str,
    store: PayoutStore,
    ctx: WorkContext,
    finledger: FinLedger,
    make_publisher: MakePublisher,
) -> None:
    """Dead letters can be listed, retried (then delivered) and discarded, each audited."""
    ghost = "ghost-" + (await new_account(store, ctx)).removeprefix("acct-")
    await store.create_account(ghost, ctx)
    await post_payout(store, ctx, "acct-" + ghost.removeprefix("ghost-"))
    await finledger.set_faults(unknown_account_prefixes=["ghost-"])
    publisher = make_publisher()
    await publisher.drain()
    [dead] = await outbox_rows(pool, "status = 'delivery_failed'")

    listed = cli(outbox_db, "list", "--status", "delivery_failed", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["summary"]["delivery_failed"] == 1 and data["rows"][0]["event_id"] == str(
        dead["event_id"]
    )

    missing = cli(outbox_db, "retry", "--event-id", str(dead["event_id"]))
    assert missing.returncode == 2 and "--reason" in missing.stderr
    # No operator credential, or a component's: refused before anything is read or changed.
    for who in (None, "outbox"):
        unauth = cli(
            outbox_db, "retry", "--event-id", str(dead["event_id"]), "--reason", "x", who=who
        )
        assert unauth.returncode == 2 and "refused, nothing changed" in unauth.stderr
        assert (await outbox_rows(pool, "event_id = $1", dead["event_id"]))[0][
            "status"
        ] == "delivery_failed"
    wrong = cli(outbox_db, "retry", "--status", "pending", "--operator", "ops", "--reason", "x")
    assert wrong.returncode == 2
    delivered = (await outbox_rows(pool, "status = 'delivered'"))[0]
    refused = cli(
        outbox_db,
        "discard",
        "--event-id",
        str(delivered["event_id"]),
        "--operator",
        "ops",
        "--reason",
        "x",
    )
    assert refused.returncode == 2 and "not dead-lettered" in refused.stderr

    await finledger.set_faults(unknown_account_prefixes=[])  # finance opened the account
    retried = cli(
        outbox_db,
        "retry",
        "--event-id",
        str(dead["event_id"]),
        "--operator",
        "mallory",  # ignored: the audit names the token's identity
        "--reason",
        "account opened",
        who="alice",
    )
    assert retried.returncode == 0, retried.stderr
    assert (await outbox_rows(pool, "event_id = $1", dead["event_id"]))[0]["status"] == "pending"
    await publisher.drain()
    assert (await outbox_rows(pool, "event_id = $1", dead["event_id"]))[0]["status"] == "delivered"

    await finledger.set_faults(
        rules=[
            {"account_id": "acct-" + ghost.removeprefix("ghost-"), "action": "fail", "status": 400}
        ]
    )
    await post_payout(store, ctx, "acct-" + ghost.removeprefix("ghost-"))
    await publisher.drain()
    failed = await outbox_rows(pool, "status = 'delivery_failed'")
    assert failed
    discarded = cli(
        outbox_db,
        "discard",
        "--status",
        "delivery_failed",
        "--reason",
        "sent by hand",
        who="bob",
    )
    assert discarded.returncode == 0, discarded.stderr
    assert await outbox_rows(pool, "status = 'delivery_failed'") == []
    assert len(await outbox_rows(pool, "status = 'discarded'")) == len(failed)
    await publisher.drain()
    assert len(await outbox_rows(pool, "status = 'discarded'")) == len(failed)  # never sent again

    async with pool.acquire() as conn:
        audit = await conn.fetch(
            "SELECT actor, action, details FROM paydb.audit_log WHERE action LIKE 'outbox.%' ORDER BY audit_id"
        )
    assert [(a["actor"], a["action"]) for a in audit] == [("alice", "outbox.retry")] + [
        ("bob", "outbox.discard")
    ] * len(failed)
    first = json.loads(audit[0]["details"])
    assert first["reason"] == "account opened" and first["from_status"] == "delivery_failed"
