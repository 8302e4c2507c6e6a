"""The rail stub's movement log: recorded at receipt, durable across restarts, and a consistency
statement (complete_from .. complete_through) that is true of it, on a possibly skewed clock."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from railstub import create_app as create_stub
from stack.embedded.shared import free_port
from tests.credentials import headers, server_env
from tests.rail import STUB_SETTINGS, Stub
from tests.servers import ServerThread
from tests.waiting import wait_for

PAY = {"account_id": "a", "amount": 5}


async def _lookup(c: httpx.AsyncClient, reference: str) -> dict[str, Any]:
    r = await c.get("/lookup", params={"client_reference": reference})
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


async def _movements(c: httpx.AsyncClient) -> dict[str, Any]:
    r = await c.get("/admin/movements")
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _about(delta: timedelta, seconds: float) -> bool:
    """Equal up to float rounding of epoch seconds (microseconds), not a timing tolerance."""
    return abs(delta.total_seconds() - seconds) < 1e-3


@contextlib.contextmanager
def stub_on(path: Path | None, **behaviour: Any) -> Iterator[str]:
    """A stub process-alike (its own app, lifespan and log) over `path`; yields its URL."""
    settings = STUB_SETTINGS.model_copy(update={"movements_path": path, **behaviour})
    server = ServerThread(create_stub(settings))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


async def test_instruction_is_recorded_at_receipt_and_pending_until_its_latency(
    stub: Stub,
) -> None:
    """A slow submission is in the log (and the lookup) as pending before the rail answers it;
    once its latency has passed the same movement is settled."""
    await stub.set(rules=[{"reference_prefix": "slow-", "latency_ms": 2000}])
    async with httpx.AsyncClient(base_url=stub.url, timeout=30) as c:
        submit = asyncio.create_task(
            c.post("/payments", json={"client_reference": "slow-1", **PAY})
        )

        async def recorded() -> bool:
            return bool(await stub.movements("slow-1"))

        await wait_for(recorded)
        seen = (await stub.movements("slow-1"))[0]
        looked_up = (await _lookup(c, "slow-1"))["status"]
        answered = submit.done()
        response = await submit
        after = (await stub.movements("slow-1"))[0]
    # Pending means "received, latency not yet passed": the rail knew it before it answered.
    assert (seen["status"], looked_up, answered) == ("pending", "pending", False)
    assert response.json()["status"] == "settled"
    assert (after["movement_id"], after["status"]) == (seen["movement_id"], "settled")
    assert _about(_at(seen["settles_at"]) - _at(seen["recorded_at"]), 2.0)


async def test_lost_instructions_record_nothing_even_while_stalled(stub: Stub) -> None:
    """timeout_before never reaches the rail: nothing is recorded during or after its latency."""
    await stub.set(stall_s=0.2, rules=[{"reference_prefix": "tb-", "action": "timeout_before"}])
    async with httpx.AsyncClient(base_url=stub.url, timeout=30) as c:
        r = await c.post("/payments", json={"client_reference": "tb-1", **PAY})
        assert r.status_code == 504
        assert (await _lookup(c, "tb-1"))["status"] == "not_found"
    assert await stub.movements() == []


async def test_durable_log_survives_a_restart_on_the_same_file(tmp_path: Path) -> None:
    """Restarted on the same file, the stub knows every movement (lookup, movements, counts),
    keeps its completeness epoch, and a pending movement still settles."""
    path = tmp_path / "movements.sqlite"
    with stub_on(path, completion_delay_s=1.0) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            await c.post("/payments", json={"client_reference": "d-1", **PAY})
            await c.post("/payments", json={"client_reference": "d-1", **PAY})
            await c.post(
                "/admin/behaviour",
                json={"rules": [{"reference_prefix": "dl-", "action": "delayed"}]},
            )
            delayed = await c.post("/payments", json={"client_reference": "dl-1", **PAY})
            assert delayed.status_code == 202
            before = await _movements(c)
    with stub_on(path) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            after = await _movements(c)
            assert (await _lookup(c, "d-1"))["status"] == "settled"

            async def settled() -> bool:
                return bool((await _lookup(c, "dl-1"))["status"] == "settled")

            await wait_for(settled)
            lookup = await _lookup(c, "d-1")
    ids = [m["movement_id"] for m in before["movements"]]
    assert [m["movement_id"] for m in after["movements"]] == ids and len(ids) == 3
    assert after["counts"] == {"d-1": 2, "dl-1": 1}
    assert after["complete_from"] == before["complete_from"]
    assert _at(lookup["complete_from"]) == _at(before["complete_from"])


async def test_in_memory_log_never_claims_the_time_before_its_process(tmp_path: Path) -> None:
    """Without a file, a restarted stub has forgotten: its statement starts after the forgotten
    movement, so a not_found for it proves nothing."""
    with stub_on(None) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            await c.post("/payments", json={"client_reference": "m-1", **PAY})
            recorded = _at((await _movements(c))["movements"][0]["recorded_at"])
    with stub_on(None) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            found = await _lookup(c, "m-1")
    assert found["status"] == "not_found"
    assert _at(found["complete_from"]) > recorded


async def test_reset_restarts_completeness_and_the_window_is_never_reversed(stub: Stub) -> None:
    """/admin/reset clears the log and moves complete_from to the reset; complete_through never
    precedes it, even with a visibility delay longer than the log's age."""
    async with httpx.AsyncClient(base_url=stub.url, timeout=10) as c:
        await c.post("/payments", json={"client_reference": "r-1", **PAY})
        recorded = _at((await _movements(c))["movements"][0]["recorded_at"])
        await stub.reset()
        await stub.set(visibility_delay_s=3600)
        found = await _lookup(c, "r-1")
        movements = await _movements(c)
    assert (found["status"], movements["movements"]) == ("not_found", [])
    assert _at(found["complete_from"]) > recorded
    assert _at(found["complete_through"]) == _at(found["complete_from"])


async def test_clock_skew_shifts_every_reported_time(stub: Stub) -> None:
    """A rail whose clock is off reports complete_through, complete_from and recorded_at on it."""
    async with httpx.AsyncClient(base_url=stub.url, timeout=10) as c:
        await c.post("/payments", json={"client_reference": "s-1", **PAY})
        plain, plain_log = await _lookup(c, "s-1"), await _movements(c)
        assert (await c.post("/admin/behaviour", json={"clock_skew_s": 600})).status_code == 200
        skewed, skewed_log = await _lookup(c, "s-1"), await _movements(c)
        too_far = await c.post("/admin/behaviour", json={"clock_skew_s": -3601})
    assert _about(_at(skewed["complete_from"]) - _at(plain["complete_from"]), 600)
    assert _at(skewed["complete_through"]) - _at(plain["complete_through"]) >= timedelta(
        seconds=599.999
    )
    assert _at(skewed["complete_through"]) > datetime.now(UTC) + timedelta(seconds=300)
    recorded = [_at(log["movements"][0]["recorded_at"]) for log in (plain_log, skewed_log)]
    assert _about(recorded[1] - recorded[0], 600)
    assert too_far.status_code == 422


def test_killed_stub_process_restarted_on_its_file_knows_every_movement(tmp_path: Path) -> None:
    """`python -m railstub` SIGKILLed right after answering (no shutdown, no flush) and started
    again on the same RAILSTUB_MOVEMENTS_PATH: every movement and the epoch are still there."""
    env = {"RAILSTUB_MOVEMENTS_PATH": str(tmp_path / "m.sqlite"), "RAILSTUB_AMBIGUITY_RATE": "0"}
    with _stub_process(tmp_path, env) as url:
        for i in range(5):
            r = httpx.post(
                f"{url}/payments",
                json={"client_reference": f"k-{i}", **PAY},
                timeout=30,
                headers=headers("railproxy"),
            )
            assert r.status_code == 200
        before = httpx.get(f"{url}/admin/movements", timeout=10, headers=headers()).json()
    with _stub_process(tmp_path, env) as url:
        after = httpx.get(f"{url}/admin/movements", timeout=10, headers=headers()).json()
        found = httpx.get(
            f"{url}/lookup",
            params={"client_reference": "k-3"},
            timeout=10,
            headers=headers("railproxy"),
        ).json()
    assert [m["movement_id"] for m in after["movements"]] == [
        m["movement_id"] for m in before["movements"]
    ]
    assert after["counts"] == {f"k-{i}": 1 for i in range(5)}
    assert after["complete_from"] == before["complete_from"]
    assert found["status"] == "settled"


@contextlib.contextmanager
def _stub_process(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """A real stub process; left by SIGKILL, as a crash would leave it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "stub.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "railstub"],
            env={**os.environ, **env, **server_env("railstub"), "RAILSTUB_PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp_path / "stub.log").read_text()[-2000:])
            time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
