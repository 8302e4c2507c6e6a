"""Unit tests of restored-data detection (lockservice.server.watermark) over the FAKE backend: the file
survives a restart, a backend behind it is refused until an epoch bump, concurrent grants never
trip it, and a grant refused after the backend committed it is released, never answered.
The real restores (pg_restore, etcd snapshot restore) are in test_restore.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from lockservice.api import BackendUnavailable, Grant, RestoreDetected
from lockservice.sdk import LockClient
from lockservice.server import create_app
from lockservice.server.watermark import LOCK_RESTORE_DETECTED, Mark, Watermark, location_identity
from tests.lockservice.fake_backend import FakeBackend

_ID = location_identity("postgres", "", "postgresql://u:secret@db:5432/pay", [])


async def _grant(fake: FakeBackend, wm: Watermark, key: str) -> int:
    s = await fake.open_session(60)
    floor = wm.mark
    g = await fake.acquire(s.session_id, key, 0)
    assert isinstance(g, Grant)
    await wm.after_grant(fake, g.token, floor)
    return g.token


def _on_disk(wm: Watermark) -> dict[str, int]:
    data: dict[str, int] = json.loads(wm.path.read_text())
    return data


def test_identity_has_no_credentials() -> None:
    assert "secret" not in _ID and "db:5432/pay" in _ID


async def test_watermark_survives_restart_and_refuses_a_backend_behind_it(tmp_path: Path) -> None:
    fake = FakeBackend()
    wm = Watermark.open(tmp_path, _ID)
    await wm.check(fake)
    tokens = [await _grant(fake, wm, f"k{i}") for i in range(5)]
    on_disk = _on_disk(wm)
    assert on_disk["counter"] == 5 and on_disk["highest_token"] == max(tokens)

    # "Restore": the fake's issuance counter goes back to 2 grants; a restarted server sees it.
    del fake.issued[2:]
    wm = Watermark.open(tmp_path, _ID)
    with capture_logs() as logs, pytest.raises(RestoreDetected, match="bump-epoch"):
        await wm.check(fake)
    with pytest.raises(RestoreDetected):
        await wm.check(fake)
    assert [e["event"] for e in logs if e["event"] == LOCK_RESTORE_DETECTED] == [
        LOCK_RESTORE_DETECTED
    ]  # once per detection, not per refused request
    assert wm.blocked

    await fake.bump_epoch(0, "ops", "restored")
    await wm.check(fake)
    assert not wm.blocked
    assert _on_disk(wm)["epoch"] == 1


async def test_concurrent_grants_never_look_like_a_restore(tmp_path: Path) -> None:
    fake = FakeBackend()
    wm = Watermark.open(tmp_path, _ID)
    await wm.check(fake)
    tokens = await asyncio.gather(*(_grant(fake, wm, f"k{i}") for i in range(30)))
    assert wm.mark is not None and wm.mark.counter == 30 and wm.mark.highest_token == max(tokens)


async def test_a_grant_on_restored_data_is_released_and_answered_503(tmp_path: Path) -> None:
    fake = FakeBackend()
    wm = Watermark.open(tmp_path, _ID)
    await wm.check(fake)
    await _grant(fake, wm, "a")
    await _grant(fake, wm, "b")
    # Restored beneath a running server, losing ONE grant: the next grant takes the counter back
    # to exactly the watermark (not below it), which must be refused too.
    del fake.issued[1:]
    transport = httpx.ASGITransport(app=create_app(fake, watermark=wm))
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        sid = (await http.post("/v1/sessions", json={"ttl_s": 60})).json()["session_id"]
        for _ in range(2):  # and it stays refused: the refused grants moved the counter again
            r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": "c"})
            assert r.status_code == 503 and r.json()["code"] == "restore_detected"
            assert "c" not in fake.held  # the committed grant was released, never answered
        await fake.bump_epoch(0, "ops", "restored")
        r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": "c"})
        assert r.status_code == 200 and r.json()["token"] >= 1 << 40


def test_a_file_of_another_location_is_refused(tmp_path: Path) -> None:
    wm = Watermark.open(tmp_path, _ID)
    wm._write(Mark(0, 1, 1))  # then the same file claimed by another identity: never reused
    raw = json.loads(wm.path.read_text())
    wm.path.write_text(json.dumps({**raw, "identity": "etcd|x|prefix="}))
    with pytest.raises(RuntimeError, match="belongs to"):
        Watermark.open(tmp_path, _ID)


async def test_the_sdk_fails_closed_and_names_the_restore(tmp_path: Path) -> None:
    """A worker's LockClient gets BackendUnavailable (fails closed, FR-27) whose message says
    restore_detected, after its bounded retries; no lease is handed out."""
    fake = FakeBackend()
    wm = Watermark.open(tmp_path, _ID)
    await wm.check(fake)
    await _grant(fake, wm, "a")
    del fake.issued[:]

    async def no_sleep(_s: float) -> None:
        return None

    transport = httpx.ASGITransport(app=create_app(fake, watermark=wm))
    client = LockClient("http://lock", attempts=2, sleep=no_sleep, transport=transport)
    try:
        with pytest.raises(BackendUnavailable, match="503 restore_detected"):
            await client.acquire("payout:acct-1")
    finally:
        await client.close()
    assert "payout:acct-1" not in fake.held
