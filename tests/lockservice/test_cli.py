"""Operator commands (`python -m lockservice ...`) run as real subprocesses against a real lock
server over both real backends: readable output, exit 0 on success, non-zero and one clear line
on error."""

from __future__ import annotations

import asyncio
import sys

import httpx

from stack.embedded.shared import free_port
from tests.lockservice import server_fixtures as _fx

live_server = _fx.live_server  # fixture
real_backend = _fx.real_backend  # fixture


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lockservice",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _hold(url: str, key: str) -> int:
    async with httpx.AsyncClient(base_url=url) as http:
        sid = (await http.post("/v1/sessions", json={"ttl_s": 60})).json()["session_id"]
        r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": key})
        return int(r.json()["token"])


async def test_inspect_and_revoke(live_server: str) -> None:
    """inspect shows holder and token; revoke ends the grant (exit 0); then the key is free."""
    token = await _hold(live_server, "payout:cli-1")
    rc, out, err = await _cli("inspect", "payout:cli-1", "--url", live_server)
    assert rc == 0, err
    assert "held" in out and str(token) in out

    rc, out, err = await _cli(
        "revoke",
        "payout:cli-1",
        "--operator",
        "ann",
        "--reason",
        "stuck holder",
        "--url",
        live_server,
    )
    assert rc == 0, err
    # This server runs without credentials (tests/lockservice/test_auth.py covers them): the
    # audited operator is what the server authenticated, never the typed --operator.
    assert f"token {token} ended" in out and "unauthenticated" in out and "ann" not in out

    rc, out, err = await _cli("inspect", "payout:cli-1", "--url", live_server)
    assert rc == 0 and "free" in out


async def test_revoke_without_reason_fails_and_changes_nothing(live_server: str) -> None:
    """revoke without --reason exits non-zero with one clear line, and the holder keeps the lock."""
    token = await _hold(live_server, "payout:cli-2")
    rc, out, err = await _cli("revoke", "payout:cli-2", "--operator", "ann", "--url", live_server)
    assert rc != 0 and out == ""
    assert err.strip().count("\n") == 0 and "--reason is required" in err
    rc, out, _ = await _cli("inspect", "payout:cli-2", "--url", live_server)
    assert rc == 0 and str(token) in out and "held" in out


async def test_bad_key_shows_server_error(live_server: str) -> None:
    """A 4xx from the server becomes a non-zero exit with its code and message on one line."""
    rc, _, err = await _cli("inspect", "bad key!", "--url", live_server)
    assert rc != 0 and "invalid_request" in err and err.strip().count("\n") == 0


async def test_unreachable_server() -> None:
    """An unreachable URL exits non-zero with a 'cannot reach' message (no traceback)."""
    url = f"http://127.0.0.1:{free_port()}"
    rc, _, err = await _cli("inspect", "payout:x", "--url", url, "--timeout", "2")
    assert rc != 0 and "cannot reach lock server" in err and "Traceback" not in err
