"""Issue 28 §1: `payouts payout list` answers from the payment database, so a payout mid-submit
is found as CLAIMED while Temporal's `PayoutState` still says PENDING, through the real console
script on a real stack. The worker is paused (SIGSTOP) while the rail holds its submit, so the
moment lasts as long as the test needs, however slow the machine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.client import Client

from payouts.batch import PayoutSpec
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.config import StackConfig
from stack.envfile import stack_environment
from stack.system import Stack
from workflows.search_attributes import PAYOUT_STATE

PAYOUTS = str(Path(sys.executable).parent / "payouts")
#: The rail answers each submit after this long: time to see the claim and pause the worker.
RAIL_LATENCY_MS = 5000


def _run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PAYOUTS, "payout", "list", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def _list(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(await asyncio.to_thread(_run, env, *args, "--json"))
    return rows


async def _until_listed(env: dict[str, str], state: str, payout_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rows = await _list(env, "--state", state)
        found = [r for r in rows if r["payout_id"] == payout_id]
        if found:
            return found[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"{payout_id} never listed as {state}")


async def _until_db_state(database_url: str, payout_id: str, state: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + 180
        sql = "SELECT state FROM paydb.payouts WHERE payout_id = $1"
        while await conn.fetchval(sql, payout_id) != state:
            assert time.monotonic() < deadline, f"{payout_id} never {state}"
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def _payout_state_attribute(stack: Stack, payout_id: str) -> str | None:
    client = await Client.connect(stack.temporal_address)
    described = await client.get_workflow_handle(f"payout-{payout_id}").describe()
    return described.typed_search_attributes.get(PAYOUT_STATE)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a stack's start alone takes minutes on a loaded 2-core machine
async def test_list_finds_a_payout_mid_submit_as_claimed(
    stack_env: dict[str, str], stack_dir: Path, external_database_url: str | None
) -> None:
    config = StackConfig.from_env(
        stack_env, run_dir=stack_dir, workers=1, database_url=external_database_url
    )
    async with Stack(config) as stack:
        env = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
        env |= stack_environment(stack)
        async with httpx.AsyncClient(
            base_url=stack.railstub_url, timeout=10, headers=stack.operator_headers()
        ) as http:
            behaviour = {"latency_mode": "fixed", "latency_fixed_ms": RAIL_LATENCY_MS}
            (await http.post("/admin/behaviour", json=behaviour)).raise_for_status()
        prefix = f"list{uuid.uuid4().hex[:6]}-"
        paydb = stack.role_dsn("PAYDB_DATABASE_URL")
        accounts = await seed_accounts(paydb, 1, 10_000, prefix)
        spec = PayoutSpec(f"{prefix}p", accounts[0], 1234)
        await create_payouts(paydb, [spec])
        pending = await _list(env, "--state", "PENDING")
        assert [r["payout_id"] for r in pending] == [spec.payout_id]
        await start_workflows(
            stack.temporal_address, stack.config.task_queue, [spec], lookup_interval_s=2.0
        )

        # While the rail holds the submit, the database says CLAIMED: the worker is paused
        # there, and the list says CLAIMED too, where Temporal's attribute is still PENDING.
        await _until_db_state(stack.database_url, spec.payout_id, "CLAIMED")
        stack.kill("worker-1", signal.SIGSTOP)
        try:
            claimed = await _until_listed(env, "CLAIMED", spec.payout_id)
            assert claimed["amount"] == 1234 and claimed["account_id"] == accounts[0]
            assert datetime.fromisoformat(claimed["updated_at"]).tzinfo is not None
            # Negative control: the same payout is not listed in the state it left.
            pending = await _list(env, "--state", "PENDING")
            assert spec.payout_id not in {r["payout_id"] for r in pending}
            assert await _payout_state_attribute(stack, spec.payout_id) == "PENDING"
        finally:
            stack.kill("worker-1", signal.SIGCONT)

        posted = await _until_listed(env, "POSTED", spec.payout_id)
        assert posted["updated_at"] >= claimed["updated_at"]
        mine = await _list(env, "--account", accounts[0])
        assert [(r["payout_id"], r["state"]) for r in mine] == [(spec.payout_id, "POSTED")]

        args = ("--state", "POSTED", "--account", accounts[0])
        text = (await asyncio.to_thread(_run, env, *args)).splitlines()
        assert text[0].split() == ["PAYOUT", "STATE", "AMOUNT", "ACCOUNT", "UPDATED"]
        assert text[1].split()[:4] == [spec.payout_id, "POSTED", "1234", accounts[0]]
        assert text[-1] == "1 payout(s)"
