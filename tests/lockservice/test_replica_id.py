"""Each lock-server replica's identity (issue 26 §1): several lock servers share one backend
behind a load balancer, and an operator must see which one carried out an audited action.

Two replicas built from their own settings (`app_from_settings`, as `python -m lockservice serve`
builds one) share one real backend of each kind: the force-revoke one carries out and the epoch
bump the other does are each audited with that replica's `LOCK_REPLICA_ID`, beside the fields
the records always had; each replica's start-up event and `/health` name it. Unset, the id is
`<hostname>:<pid>`, as the rail proxy's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from structlog.testing import capture_logs

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from lockservice.server import LockSettings, app_from_settings
from tests.grants import TEST_KID, grant_keys

KEY = "payout:replica-acct"
IDENTITIES: dict[str, Kind] = {"local-operator": "operator", "worker": "component"}


@pytest.fixture
def headers(tmp_path: Path) -> dict[str, dict[str, str]]:
    """Authorization headers per identity; the credentials file is `tmp_path/lock-server.json`."""
    files = issue_tokens(tmp_path / "tokens", IDENTITIES)
    write_credentials(tmp_path / "lock-server.json", IDENTITIES, files)
    return {
        name: {"Authorization": f"Bearer {read_token(token_file=path)}"}
        for name, path in files.items()
    }


def _settings(
    backend_kind: Literal["postgres", "etcd"],
    address: str | list[str],
    prefix: str,
    creds: Path,
    replica: str,
) -> Any:
    """The settings of one replica (tests/lockservice/conftest.py: `backend_kind` is
    parametrized over both backends, `backend_address` is the session server of that kind)."""
    if isinstance(address, list):
        address = ",".join(address)
    return LockSettings(
        backend=backend_kind,
        database_url=address if backend_kind == "postgres" else None,
        etcd_endpoints=address if backend_kind == "etcd" else None,
        key_prefix=prefix,
        signing_key_path=str(grant_keys().private_path),
        signing_key_id=TEST_KID,
        credentials_path=str(creds),
        replica_id=replica,
    )


@contextlib.asynccontextmanager
async def _running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan run (the backend connected, `lock.server_started` logged)."""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lock") as http,
    ):
        yield http


async def test_each_replica_names_itself_in_its_audit_records_events_and_health(
    backend_kind: Literal["postgres", "etcd"],
    backend_address: str | list[str],
    key_prefix: str,
    headers: dict[str, dict[str, str]],
    tmp_path: Path,
) -> None:
    """Replica A's force-revoke and replica B's epoch bump on one backend are audited (record and
    event) with the id of the replica that carried each out; each replica's start-up event and
    /health answer its own id."""
    run = uuid.uuid4().hex[:8]
    ids = {"a": f"lock-a-{run}", "b": f"lock-b-{run}"}
    creds = tmp_path / "lock-server.json"
    apps = {
        r: app_from_settings(_settings(backend_kind, backend_address, key_prefix, creds, ids[r]))
        for r in ids
    }
    operator, worker = headers["local-operator"], headers["worker"]
    with capture_logs() as logs:
        async with _running(apps["a"]) as a, _running(apps["b"]) as b:
            health = {r: (await http.get("/health")).json() for r, http in (("a", a), ("b", b))}
            sid = (await a.post("/v1/sessions", json={"ttl_s": 30}, headers=worker)).json()
            body = {"session_id": sid["session_id"], "key": KEY}
            token = (await b.post("/v1/locks/acquire", json=body, headers=worker)).json()["token"]
            revoke = {"key": KEY, "reason": "worker wedged"}
            assert (await a.post("/v1/locks/revoke", json=revoke, headers=operator)).is_success
            bump = {"min_epoch": 0, "reason": "drill"}
            assert (await b.post("/v1/epoch/bump", json=bump, headers=operator)).is_success
            audit = await apps["a"].state.lock.be().audit_records()

    assert health == {r: {"status": "ok", "backend": "reachable", "replica": ids[r]} for r in ids}
    # PostgreSQL keeps the action's own fields in `detail`; etcd's record is flat.
    detail = [r.get("detail", r) for r in audit]
    assert [
        (r["action"], r["operator"], d["replica"]) for r, d in zip(audit, detail, strict=True)
    ] == [
        ("force_revoke", "local-operator", ids["a"]),
        ("bump_epoch", "local-operator", ids["b"]),
    ]
    assert (audit[0]["key"], audit[0]["reason"], detail[0]["revoked_token"]) == (
        KEY,
        "worker wedged",
        token,
    )
    assert (detail[1]["old_epoch"], detail[1]["new_epoch"]) == (0, 1)
    started = [e["replica"] for e in logs if e["event"] == "lock.server_started"]
    assert sorted(started) == sorted(ids.values())
    assert [e["replica"] for e in logs if e["event"] == "lock.revoked"] == [ids["a"]]
    assert [e["replica"] for e in logs if e["event"] == "lock.epoch_bumped"] == [ids["b"]]


def test_the_replica_id_defaults_to_host_and_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, LOCK_REPLICA_ID is `<hostname>:<pid>` (unique per process); set, it is taken as
    given; empty or longer than 128 characters is refused."""
    monkeypatch.delenv("LOCK_REPLICA_ID", raising=False)
    assert LockSettings().replica_id == f"{socket.gethostname()}:{os.getpid()}"
    monkeypatch.setenv("LOCK_REPLICA_ID", "lock-server-1")
    assert LockSettings().replica_id == "lock-server-1"
    for bad in ("", "x" * 129):
        monkeypatch.setenv("LOCK_REPLICA_ID", bad)
        with pytest.raises(ValidationError):
            LockSettings()
