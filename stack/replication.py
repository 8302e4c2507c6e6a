"""A PostgreSQL primary with a streaming-replication standby from pgserver's binaries (issue 26).

Owns: creating the standby from the primary (`pg_basebackup -R`), synchronous or asynchronous
commit to it (`synchronous_standby_names`, `synchronous_commit=on`), the multi-host DSN clients
use to find the writable node (`target_session_attrs=read-write`), and the failover steps the
tests and the chaos fault `db_failover` take: SIGKILL of the primary's whole process group,
`pg_ctl promote` of the standby, and (asynchronous only, the negative control) detaching the
standby's WAL receiver so that commits on the primary provably never reach it.
Must never: promote a standby while the old primary still accepts writes (split brain: the
primary is killed and its death awaited first), or report a failover done before the promoted
node accepts writes.

Why synchronous loses nothing: with `synchronous_commit=on` and the standby named in
`synchronous_standby_names`, the primary answers COMMIT only after the standby has flushed the
commit's WAL. A grant (or fence, attempt, ledger row, outbox row) whose commit anyone saw is
therefore on the standby's disk when the primary dies, and promotion replays it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stack.embedded.postgres import EmbeddedPostgres, PostgresTLS, pg_bin
from stack.embedded.shared import EmbeddedServerError, free_port

#: What each node calls itself to the other (cluster_name is the WAL receiver's application_name
#: when primary_conninfo names none, and synchronous_standby_names matches on it).
_NAMES = ("pg_a", "pg_b")


def multi_host_url(
    ports: list[int], database: str = "postgres", tls: PostgresTLS | None = None
) -> str:
    """The DSN that connects to whichever of the nodes accepts writes (libpq and asyncpg try the
    hosts in order and skip a read-only one or one that is down); with `tls`, verified TLS to
    each node's front."""
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    query = "target_session_attrs=read-write" + (f"&{tls.url_query()}" if tls else "")
    return f"postgresql://postgres@{hosts}/{database}?{query}"


@dataclass
class _Node:
    name: str
    server: EmbeddedPostgres


@dataclass
class ReplicatedPostgres:
    """Two PostgreSQL 16 clusters on loopback: a primary and a standby streaming from it.

    `synchronous=True` makes every commit wait for the standby's flush; False is the
    asynchronous negative control. `fast` (tests only) turns fsync off but never
    synchronous_commit: that setting is what this topology is about."""

    base_dir: Path
    synchronous: bool = True
    fast: bool = False
    #: Each node behind its own TLS front (EmbeddedPostgres.tls); replication itself streams over
    #: the primary's Unix socket, which pgserver's libpq (no SSL) can reach.
    tls: PostgresTLS | None = None
    _nodes: list[_Node] = field(default_factory=list)
    failovers: int = 0

    def __post_init__(self) -> None:
        if not self._nodes:
            self._nodes = [
                _Node(
                    name,
                    EmbeddedPostgres(data_dir=self.base_dir / name, fast=self.fast, tls=self.tls),
                )
                for name in _NAMES
            ]

    @property
    def primary(self) -> EmbeddedPostgres:
        return self._nodes[0].server

    @property
    def standby(self) -> EmbeddedPostgres:
        return self._nodes[1].server

    @property
    def url(self) -> str:
        """The multi-host DSN; stays valid across a failover (both addresses are in it)."""
        return multi_host_url([n.server.port for n in self._nodes], tls=self.tls)

    def start(self, timeout: float = 60) -> str:
        """Start the primary, clone the standby from it, name the standby synchronous (ALTER
        SYSTEM on the primary only, after the clone: the standby must not inherit it, or once
        promoted it would wait for a standby of its own that does not exist), start the standby
        and wait until the primary reports it streaming (sync or async). Returns `url`."""
        first, second = self._nodes
        for node in self._nodes:
            node.server.extra_options = (f"cluster_name={node.name}", "synchronous_commit=on")
        first.server.start(timeout)
        if not (second.server.data_dir / "PG_VERSION").exists():
            self._base_backup(first.server, second.server)
        names = second.name if self.synchronous else ""
        _psql(first.server, f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        _psql(first.server, "SELECT pg_reload_conf()")
        second.server.start(timeout)
        self._await_streaming(first.server, second.name, timeout)
        return self.url

    def _base_backup(self, source: EmbeddedPostgres, target: EmbeddedPostgres) -> None:
        target.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        target.data_dir.chmod(0o700)
        target.give_to_server_user(target.data_dir)
        target.run_as_server_user(
            [
                pg_bin("pg_basebackup"),
                "-h",
                str(source.data_dir),  # its socket: the TCP port may be the TLS front's
                "-p",
                str(source.port),
                "-U",
                "postgres",
                "-D",
                str(target.data_dir),
                "-R",  # standby.signal + primary_conninfo pointing at the source
                "-X",
                "stream",
                "--checkpoint=fast",
            ],
            timeout=300,
        )

    def _await_streaming(self, primary: EmbeddedPostgres, name: str, timeout: float) -> None:
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _psql(primary, _REPLICATION_STATE.format(name=name)) == want:
                return
            time.sleep(0.1)
        raise EmbeddedServerError(f"standby {name} did not reach state {want!r}")

    def standby_pid(self) -> int | None:
        """The standby's postmaster pid while it runs (None once it died in a failover)."""
        return _postmaster_pid(self.standby) if self.standby.is_running() else None

    def kill_primary(self, timeout: float = 30) -> None:
        """SIGKILL the primary's postmaster and every backend (its process group: pg_ctl starts
        it in its own session), as a machine dying would, and wait until the port is closed."""
        pid = _postmaster_pid(self.primary)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.primary.is_running() or (pid is not None and _alive(pid)):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"primary on {self.primary.port} outlived SIGKILL")
            time.sleep(0.05)

    def promote(self, timeout: float = 60) -> None:
        """`pg_ctl promote` the standby, wait until it accepts writes, and make it the primary
        (the dead node becomes the standby slot, not running)."""
        standby = self.standby
        wait = ["-w", "-t", str(int(timeout))]
        standby.run_as_server_user(
            [pg_bin("pg_ctl"), "-D", str(standby.data_dir), *wait, "promote"], timeout + 5
        )
        deadline = time.monotonic() + timeout
        while _psql(standby, "SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"promoted node on {standby.port} still read-only")
            time.sleep(0.05)
        self._nodes.reverse()
        self.failovers += 1

    def failover(self, timeout: float = 60) -> None:
        """The primary dies (SIGKILL), then the standby is promoted: never both writable."""
        self.kill_primary(timeout)
        self.promote(timeout)

    def wait_caught_up(self, timeout: float = 30) -> None:
        """Wait until the standby has replayed everything the primary has written so far."""
        sql = (
            "SELECT coalesce(bool_and(replay_lsn >= pg_current_wal_lsn()), false)"
            " FROM pg_stat_replication"
        )
        deadline = time.monotonic() + timeout
        while _psql(self.primary, sql) != "t":
            if time.monotonic() > deadline:
                raise EmbeddedServerError("the standby did not catch up with the primary")
            time.sleep(0.05)

    def detach_standby(self, timeout: float = 30) -> None:
        """Stop the standby's WAL receiver (primary_conninfo emptied and reloaded) and wait until
        the primary has no WAL sender left: from then on, nothing the primary commits reaches the
        standby. Asynchronous only: a synchronous primary would block every commit instead."""
        if self.synchronous:
            raise EmbeddedServerError("detach_standby is for the asynchronous topology only")
        _psql(self.standby, "ALTER SYSTEM SET primary_conninfo = ''")
        _psql(self.standby, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while _psql(self.primary, "SELECT count(*) FROM pg_stat_replication") != "0":
            if time.monotonic() > deadline:
                raise EmbeddedServerError("the standby's WAL receiver did not stop")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self._nodes:
            if node.server.is_running():
                node.server.stop(mode="immediate")
            else:  # killed in a failover: its TLS front is still up
                node.server.stop_front()


_REPLICATION_STATE = (
    "SELECT coalesce((SELECT sync_state FROM pg_stat_replication"
    " WHERE application_name = '{name}' AND state = 'streaming'), '')"
)


_PSQL_AS = ("-U", "postgres", "-d", "postgres", "-c")


def _psql(server: EmbeddedPostgres, sql: str) -> str:
    """One statement's single value, through psql (no event loop needed), '' on no row."""
    out = subprocess.run(
        [
            pg_bin("psql"),
            "-XAt",
            "-h",
            str(server.data_dir),
            "-p",
            str(server.port),
            *_PSQL_AS,
            sql,
        ],
        check=False,
        capture_output=True,
        timeout=30,
    )
    if out.returncode != 0:
        raise EmbeddedServerError(f"psql on {server.port} failed: {out.stderr.decode().strip()}")
    return out.stdout.decode().strip()


def _postmaster_pid(server: EmbeddedPostgres) -> int | None:
    try:
        return int((server.data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our child? never: pg_ctl daemonises it) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def running_replicated(
    base_dir: Path, *, synchronous: bool = True, fast: bool = False
) -> Iterator[ReplicatedPostgres]:
    pair = ReplicatedPostgres(base_dir=base_dir, synchronous=synchronous, fast=fast)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


__all__ = ["ReplicatedPostgres", "free_port", "multi_host_url", "running_replicated"]
