"""UC-03 with a real pause: a subprocess holding a lock is frozen with SIGSTOP past its TTL; the
lease expires server-side, the next holder gets a higher token, and the thawed holder finds its
lock lost and its renew refused. Real lock server, both real backends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lockservice.sdk import LockClient
from tests.lockservice import server_fixtures as _fx

live_server = _fx.live_server  # fixture
real_backend = _fx.real_backend  # fixture

HOLDER = r"""
import asyncio, json, sys
from lockservice import api
from lockservice.sdk import LockClient
from common.logs import configure_logging

async def main(url: str, key: str) -> None:
    configure_logging("pause-holder", stream=sys.stderr)
    loop = asyncio.get_running_loop()
    async with LockClient(url, ttl_s=2, heartbeat_s=0.5, safety_margin=0.3) as locks:
        lease = await locks.acquire(key, wait_s=5)
        print(json.dumps({"token": lease.token}), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the test says "go" after SIGCONT
        held = lease.still_held()
        try:
            await locks.renew(lease)
            renew = "ok"
        except api.LockError as exc:
            renew = exc.code
        print(json.dumps({"still_held": held, "lost": lease.lost.is_set(),
                          "lost_reason": lease.lost_reason, "renew": renew}), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def _run_holder(url: str, key: str, log: Path, *, pause: bool) -> dict[str, Any]:
    """Run the holder; with `pause`, freeze it and take the key over before thawing it."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            HOLDER,
            url,
            key,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdin is not None and proc.stdout is not None
    result: dict[str, Any] = {}
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, log.read_text()  # noqa: ASYNC240 - only on failure
        result["t1"] = json.loads(line)["token"]
        if pause:
            os.kill(proc.pid, signal.SIGSTOP)
            # The next holder waits with a budget (no sleep): it gets the key only once the
            # frozen holder's session has expired on the backend's clock.
            async with LockClient(url, ttl_s=5, heartbeat_s=1) as other:
                lease2 = await other.acquire(key, wait_s=20)
                result["t2"] = lease2.token
                os.kill(proc.pid, signal.SIGCONT)
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), 30)
                result.update(json.loads(line))
                result["t2_still_held"] = lease2.still_held()
        else:
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
            result.update(json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)))
        assert await asyncio.wait_for(proc.wait(), 30) == 0, log.read_text()  # noqa: ASYNC240
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            await proc.wait()
    return result


async def test_sigstopped_holder_loses_lock_and_next_token_is_higher(
    live_server: str, run_dir: Path, key_prefix: str
) -> None:
    """A holder frozen past its TTL loses the key to a higher token; thawed, it sees NotHeld."""
    key = f"payout:{key_prefix.strip('/')}"
    r = await _run_holder(
        live_server, key, run_dir / f"holder-{key_prefix.strip('/')}.log", pause=True
    )
    assert r["t2"] > r["t1"]
    assert r["still_held"] is False and r["lost"] is True
    assert r["renew"] == "not_held"
    assert r["t2_still_held"] is True  # the thawed holder's renew did not disturb the new holder


async def test_unpaused_holder_keeps_lock(live_server: str, run_dir: Path, key_prefix: str) -> None:
    """Negative control: the same holder without a pause still holds its lock and renews it."""
    key = f"payout:{key_prefix.strip('/')}"
    r = await _run_holder(
        live_server, key, run_dir / f"holder-{key_prefix.strip('/')}.log", pause=False
    )
    assert r["still_held"] is True and r["lost"] is False and r["renew"] == "ok"
