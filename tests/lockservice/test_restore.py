"""Restore from backup (INV-04): without the procedure the next token repeats an old one (negative
control); a lock server started on the restored data refuses grants (restored-data detection,
lockservice.server.watermark) until the offline `bump-epoch`, which works H out from every enforcement
point's stored fences; after it, the next token is higher than every token issued or seen before.

Each test uses a private server: the backup/restore tools must match its version, and a restore
must never touch the session servers. The commands run are the ones docs/locks-backends.md gives
("Restore procedure"): `pg_dump`/`pg_restore`, `python -m lockservice etcdutl snapshot restore`,
`python -m lockservice bump-epoch --offline [--dry-run]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from common.credentials import Kind, issue_tokens, write_credentials
from common.migrate import migrate
from lockservice.api import (
    MAX_EPOCH,
    MAX_EPOCH_STEP,
    TOKEN_EPOCH_STRIDE,
    Grant,
    InvalidRequest,
    LockBackend,
    RestoreDetected,
    next_epoch,
)
from lockservice.server import create_app, create_backend
from lockservice.server.restore import bump_after_restore, min_epoch_for
from lockservice.server.watermark import Watermark, location_identity
from stack.embedded.etcd import EmbeddedEtcd
from stack.embedded.postgres import EmbeddedPostgres, pg_bin
from tests.lockservice.conftest import until_available

_PREFIX = "r/"


async def _run(args: list[str]) -> str:
    """Run a backup/restore tool without blocking the event loop; fail with its stderr."""
    env = {**os.environ, "ETCDCTL_API": "3"}
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode(errors="replace")


@functools.cache
def _operator_files() -> tuple[Path, Path]:
    """An operator token file and the lock server's credentials file that accepts it."""
    base = Path(tempfile.mkdtemp(prefix="restore-creds-"))
    kinds: dict[str, Kind] = {"ops": "operator", "worker": "component"}
    tokens = issue_tokens(base / "tokens", kinds)
    return tokens["ops"], write_credentials(base / "lock-server.json", kinds, tokens)


async def _lockservice_cli(*args: str, operator: str | None = "ops") -> tuple[int, str]:
    """`python -m lockservice ARGS` as an operator runs it (a child process of the venv), with
    the operator's token file (or, `operator=None`, none)."""
    cmd = [sys.executable, "-m", "lockservice", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYOUTS_OPERATOR_TOKEN")}
    token_file, creds = _operator_files()
    env["LOCK_CREDENTIALS_PATH"] = str(creds)
    if operator == "ops":
        env["PAYOUTS_OPERATOR_TOKEN_FILE"] = str(token_file)
    elif operator is not None:
        env["PAYOUTS_OPERATOR_TOKEN"] = operator
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, check=False, env=env)
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


async def _issue(backend: LockBackend, key: str, n: int) -> list[int]:
    """Acquire and release `n` times; the tokens in order."""
    s = await backend.open_session(60)
    tokens = []
    for _ in range(n):
        g = await backend.acquire(s.session_id, key, 0)
        assert isinstance(g, Grant)
        tokens.append(g.token)
        await backend.release(g)
    await backend.close_session(s.session_id)
    return tokens


async def _next_token(backend: LockBackend, key: str) -> int:
    """The raw backend's next grant (what a server WITHOUT restore detection would answer)."""
    s = await until_available(lambda: backend.open_session(60))
    g = await backend.acquire(s.session_id, key, 0)
    assert isinstance(g, Grant)
    return g.token


@contextlib.asynccontextmanager
async def _server(backend: LockBackend, watermark: Watermark) -> AsyncIterator[httpx.AsyncClient]:
    """The lock server's HTTP app over `backend`, with restore detection on."""
    transport = httpx.ASGITransport(app=create_app(backend, watermark=watermark))
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        yield http


async def _acquire_http(http: httpx.AsyncClient, key: str) -> httpx.Response:
    s = (await http.post("/v1/sessions", json={"ttl_s": 60})).json()["session_id"]
    return await http.post("/v1/locks/acquire", json={"session_id": s, "key": key})


async def _issue_http(http: httpx.AsyncClient, key: str, n: int) -> list[int]:
    tokens = []
    for _ in range(n):
        r = await _acquire_http(http, key)
        assert r.status_code == 200, r.text
        tokens.append(r.json()["token"])
        assert (await http.post("/v1/locks/release", json=r.json())).status_code == 204
    return tokens


async def _proxy_saw(url: str, account: str, token: int) -> None:
    """The rail proxy's high-water mark for `account`, as its fenced write stores it."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO railproxy.account_fences (account_id, high_token) VALUES ($1, $2)"
            " ON CONFLICT (account_id) DO UPDATE SET high_token = excluded.high_token",
            account,
            token,
        )
    finally:
        await conn.close()


def _offline_args(url: str, *extra: str) -> list[str]:
    return [
        "bump-epoch",
        "--offline",
        "--backend",
        "postgres",
        "--database-url",
        url,
        "--prefix",
        _PREFIX,
        "--paydb-url",
        url,
        "--railproxy-url",
        url,
        "--operator",
        "ops",
        "--reason",
        "restored backup",
        *extra,
    ]


def test_min_epoch_for() -> None:
    """min_epoch_for picks the first epoch whose tokens all exceed the highest fence seen."""
    assert min_epoch_for(0) == 1
    assert min_epoch_for(TOKEN_EPOCH_STRIDE - 1) == 1
    assert min_epoch_for(TOKEN_EPOCH_STRIDE) == 2
    assert min_epoch_for(3 * TOKEN_EPOCH_STRIDE + 7) == 4


def test_next_epoch_is_bounded() -> None:
    """A bump goes at most MAX_EPOCH_STEP above max(current, needed) and never leaves the 64-bit
    token space; evidence (H) may require a larger jump, a bare request may not."""
    assert next_epoch(3, 0) == 4
    assert next_epoch(3, 3 + MAX_EPOCH_STEP) == 3 + MAX_EPOCH_STEP
    with pytest.raises(InvalidRequest, match="more than 16 above"):
        next_epoch(3, 4 + MAX_EPOCH_STEP)
    # An old restored epoch with fences from epoch 40: the evidence lifts the ceiling.
    assert next_epoch(0, 0, 40 * TOKEN_EPOCH_STRIDE + 5) == 41
    assert next_epoch(0, 41 + MAX_EPOCH_STEP, 40 * TOKEN_EPOCH_STRIDE) == 41 + MAX_EPOCH_STEP
    # The last epoch whose every token fits a signed BIGINT, and one past it.
    assert (MAX_EPOCH + 1) * TOKEN_EPOCH_STRIDE - 1 == (1 << 63) - 1
    assert next_epoch(MAX_EPOCH - 1, 0) == MAX_EPOCH
    with pytest.raises(InvalidRequest, match="64-bit"):
        next_epoch(MAX_EPOCH, 0)
    with pytest.raises(InvalidRequest, match="64-bit"):  # a forged high-water mark near 2**63
        next_epoch(0, 0, (1 << 63) - 10)


async def test_bump_refuses_an_unbounded_step_and_changes_nothing(backend: LockBackend) -> None:
    """Both backends, online (HTTP 409 epoch_refused) and direct: a step above the bound is refused and the
    epoch stays where it was (a fuzzer cannot burn the token space, issue 13)."""
    before = (await backend.issuance_position()).epoch
    with pytest.raises(InvalidRequest):
        await backend.bump_epoch(before + MAX_EPOCH_STEP + 1, "ops", "fuzz")
    transport = httpx.ASGITransport(app=create_app(backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        body = {"min_epoch": before + MAX_EPOCH_STEP + 1, "operator": "0", "reason": "0"}
        r = await http.post("/v1/epoch/bump", json=body)
        assert r.status_code == 409 and r.json()["code"] == "epoch_refused"
        assert "above the current epoch" in r.json()["message"]
        assert (await backend.issuance_position()).epoch == before
        body["min_epoch"] = before + MAX_EPOCH_STEP
        r = await http.post("/v1/epoch/bump", json=body)
        assert r.status_code == 200 and r.json()["epoch"] == before + MAX_EPOCH_STEP


async def test_postgres_restore_procedure(
    private_postgres: EmbeddedPostgres, run_dir: Path, tmp_path: Path
) -> None:
    """pg_dump the lockservice schema; bump online and issue more tokens (the rail proxy stores
    the highest); restore. Negative control: the restored data reissues a seen token. A server
    on the restored data refuses to grant (503 restore_detected); the offline bump reads H from
    the enforcement points, and after it the server grants above every earlier token."""
    url = private_postgres.url
    await migrate(url)  # every component's schema: the enforcement points' fence tables exist
    dump = run_dir / f"lockservice-{private_postgres.port}.dump"
    state_dir = tmp_path / "lock-state"
    identity = location_identity("postgres", _PREFIX, url, [])

    backend = await create_backend("postgres", database_url=url, prefix=_PREFIX)
    watermark = Watermark.open(state_dir, identity)
    await watermark.check(backend)
    async with _server(backend, watermark) as http:
        before_backup = await _issue_http(http, "acct:1", 3)
        await _run([pg_bin("pg_dump"), "-d", url, "--schema=lockservice", "-Fc", "-f", str(dump)])
        after_backup = await _issue_http(http, "acct:1", 3)
        # After the backup an epoch bump happened: "stored epoch + 1" alone would reissue these.
        bumped = {"min_epoch": 1, "operator": "ops", "reason": "drill"}
        assert (await http.post("/v1/epoch/bump", json=bumped)).json()["epoch"] == 1
        after_backup += await _issue_http(http, "acct:1", 3)
    await backend.close()  # the service is stopped during a restore
    issued = before_backup + after_backup
    await _proxy_saw(url, "acct-1", max(issued))  # the proxy's high-water mark: the last token

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP SCHEMA lockservice CASCADE")
    finally:
        await conn.close()
    await _run([pg_bin("pg_restore"), "-d", url, "--exit-on-error", str(dump)])

    # A lock server started on the restored data (its state dir survived, as it is not in the
    # backup): it detects the restore and refuses every grant.
    backend = await create_backend("postgres", database_url=url, prefix=_PREFIX)
    try:
        watermark = Watermark.open(state_dir, identity)
        with pytest.raises(RestoreDetected):
            await watermark.check(backend)
        async with _server(backend, watermark) as http:
            r = await _acquire_http(http, "acct:1")
            assert r.status_code == 503 and r.json()["code"] == "restore_detected", r.text

            # Negative control: without the detection the restored counter reissues a seen token.
            repeat = await _next_token(backend, "acct:1")
            assert repeat == after_backup[0], (repeat, issued)

            # Without an operator credential, or with a forged one, the bump refuses first.
            for who in (None, "forged-token"):
                rc, out = await _lockservice_cli(*_offline_args(url), operator=who)
                assert rc == 1 and "refused, nothing changed" in out, out
                assert (await backend.issuance_position()).epoch == 0
            # The documented offline bump: dry run first (changes nothing), then the bump.
            rc, out = await _lockservice_cli(*_offline_args(url, "--dry-run"))
            assert rc == 0 and "would set 2" in out and "dry run" in out, out
            assert (await backend.issuance_position()).epoch == 0
            rc, out = await _lockservice_cli(*_offline_args(url))
            assert rc == 0, out
            assert "railproxy.account_fences.high_token" in out and "set 2" in out, out
            assert (await backend.issuance_position()).epoch == 2  # 1 + H // 2**40

            granted = await _issue_http(http, "acct:1", 1)
            assert granted[0] > max([*issued, repeat]), (granted, issued)
            assert (await _acquire_http(http, "never-seen")).json()["token"] > max(issued)
        audit = await backend.audit_records()  # type: ignore[attr-defined]
        assert audit[-1]["detail"]["highest_fence_seen"] == max(issued)
        assert audit[-1]["operator"] == "ops"  # the identity the operator's token authenticated

        # A forged high-water mark near 2**63 (issue 13): the bump refuses, nothing changes.
        await _proxy_saw(url, "acct-9", (1 << 63) - 10)
        rc, out = await _lockservice_cli(*_offline_args(url))
        assert rc == 1 and "refused, nothing changed" in out and "64-bit" in out, out
        assert (await backend.issuance_position()).epoch == 2
    finally:
        await backend.close()


async def test_bump_after_restore_uses_the_fences() -> None:
    """bump_after_restore raises the epoch from the highest fence alone (FakeBackend at 0)."""
    from tests.lockservice.fake_backend import FakeBackend

    fake = FakeBackend()
    assert (
        await bump_after_restore(
            fake, highest_fence_seen=5 * TOKEN_EPOCH_STRIDE, operator="o", reason="r"
        )
        == 6
    )


async def test_etcd_restore_procedure(
    private_etcd: EmbeddedEtcd, private_postgres: EmbeddedPostgres, run_dir: Path, tmp_path: Path
) -> None:
    """etcdctl snapshot save, issue more tokens, `python -m lockservice etcdutl snapshot restore`
    into a new data dir and start the member on it. A server on it refuses (restore_detected);
    negative control: the restored revision reissues a seen ModRevision; the offline bump (etcd
    3.5.1 has no --bump-revision, hence the epoch) and the next token exceeds every earlier one."""
    member = private_etcd.members[0]
    snapshot = run_dir / f"etcd-{member.client_port}.snapshot"
    fences = private_postgres.url
    await migrate(fences, schemas={"paydb", "railproxy"})
    state_dir = tmp_path / "lock-state"
    identity = location_identity("etcd", _PREFIX, None, private_etcd.endpoints)

    backend = await create_backend("etcd", etcd_endpoints=private_etcd.endpoints, prefix=_PREFIX)
    watermark = Watermark.open(state_dir, identity)
    await watermark.check(backend)
    async with _server(backend, watermark) as http:
        before_backup = await _issue_http(http, "acct:1", 3)
        await _run(
            [
                str(Path(sys.executable).parent / "etcdctl"),  # the venv's console script works
                "--endpoints",
                member.client_url,
                "snapshot",
                "save",
                str(snapshot),
            ]
        )
        after_backup = await _issue_http(http, "acct:1", 3)
    await backend.close()
    issued = before_backup + after_backup
    await _proxy_saw(fences, "acct-1", max(issued))

    private_etcd.stop()
    restored = member.data_dir.with_name(member.data_dir.name + "-restored")
    await _run(
        [
            sys.executable,
            "-m",
            "lockservice",
            "etcdutl",
            "snapshot",
            "restore",
            str(snapshot),
            "--data-dir",
            str(restored),
            "--name",
            member.name,
            "--initial-cluster",
            f"{member.name}={member.peer_url}",
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster-token",
            f"payouts-{private_etcd.base_dir.name}",
        ]
    )
    member.data_dir = restored
    private_etcd.start_member(member)

    backend = await until_available(
        lambda: create_backend("etcd", etcd_endpoints=private_etcd.endpoints, prefix=_PREFIX)
    )
    try:
        watermark = Watermark.open(state_dir, identity)
        with pytest.raises(RestoreDetected):
            await watermark.check(backend)
        async with _server(backend, watermark) as http:
            r = await _acquire_http(http, "acct:1")
            assert r.status_code == 503 and r.json()["code"] == "restore_detected", r.text

            # Negative control: the restored revision counter reissues a ModRevision already seen.
            repeat = await _next_token(backend, "acct:1")
            assert repeat <= max(issued), (repeat, issued)

            rc, out = await _lockservice_cli(
                "bump-epoch",
                "--offline",
                "--backend",
                "etcd",
                "--etcd-endpoints",
                ",".join(private_etcd.endpoints),
                "--prefix",
                _PREFIX,
                "--paydb-url",
                fences,
                "--railproxy-url",
                fences,
                "--operator",
                "ops",
                "--reason",
                "restored snapshot",
            )
            assert rc == 0 and "set 1" in out, out
            granted = await _issue_http(http, "acct:1", 1)
            assert granted[0] > max([*issued, repeat])
            assert (await _acquire_http(http, "never-seen")).json()["token"] > max(issued)
        audit = await backend.audit_records()  # type: ignore[attr-defined]
        assert [r["action"] for r in audit] == ["bump_epoch"]
    finally:
        await backend.close()
