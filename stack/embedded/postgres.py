"""The embedded PostgreSQL 16 from pgserver's binaries: one cluster on 127.0.0.1 (trust auth), its
optional TLS front (`python -m stack.pgtls`), and where its binaries and files go when the stack
runs as root (an unprivileged system user must reach them).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from stack.embedded.shared import (
    EmbeddedServerError,
    free_port,
    package_dir,
    port_is_open,
    wait_for_port,
)

__all__ = [
    "EmbeddedPostgres",
    "PostgresTLS",
    "others_can_traverse",
    "pg_bin",
    "pg_data_dir",
    "start_tls_front",
    "world_reachable_copy",
]


_PG_USER = "pgserver"


def pg_bin(name: str) -> str:
    return str(_pg_install() / "bin" / name)


def others_can_traverse(path: Path) -> bool:
    """Whether a user who is neither owner nor group member can reach `path` (every existing
    ancestor has the others-execute bit). Parts that do not exist yet are made 0755 later."""
    for part in [path, *path.parents]:
        if part.exists() and not part.stat().st_mode & stat.S_IXOTH:
            return False
    return True


def _postgres_can_reach(path: Path) -> bool:
    """Whether PostgreSQL can reach `path`: it runs as us unless we are root (_pg_system_user)."""
    return os.geteuid() != 0 or others_can_traverse(path)


def _path_key(path: Path) -> str:
    """A short, stable name for a path: the same folder always maps to the same copy."""
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def world_reachable_copy(root: Path, parts: tuple[str, ...], label: str) -> Path:
    """`root` itself when others can reach `root/parts[0]`, else a copy of `parts` (paths under
    `root`, copied with their layout) under the system's temp directory; returns the new root.

    Under root, PostgreSQL runs as an unprivileged user, which cannot reach a clone under /root
    or in a `mktemp -d` directory (0700). The binaries are then copied once, keyed by where they
    came from, to a place every user can traverse. The layout is kept because the binaries find
    their shared libraries by a relative rpath ($ORIGIN/../../../pgserver.libs)."""
    if _postgres_can_reach(root / parts[0]):
        return root
    target = Path(tempfile.gettempdir()) / f"payouts-{label}-{_path_key(root)}"
    done = target / ".complete"
    if not done.exists():
        staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        for part in parts:
            if (root / part).exists():
                shutil.copytree(root / part, staging / part, symlinks=True)
        for folder in [staging, *[p for p in staging.rglob("*") if p.is_dir()]]:
            folder.chmod(folder.stat().st_mode | 0o755)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # atomic: a concurrent start sees either nothing or a whole copy
        done.touch()
    return target


def _pg_install() -> Path:
    site = package_dir("pgserver").parent
    root = world_reachable_copy(site, ("pgserver/pginstall", "pgserver.libs"), "pgserver")
    return root / "pgserver" / "pginstall"


def pg_data_dir(requested: Path) -> Path:
    """Where the cluster's files go: `requested`, unless (under root) PostgreSQL's unprivileged
    user could not reach it; then a private folder under the system's temp directory, named after
    `requested` so that the same run directory always finds its data again."""
    if _postgres_can_reach(requested.parent):
        return requested
    return Path(tempfile.gettempdir()) / f"payouts-pgdata-{_path_key(requested)}" / requested.name


def _pg_system_user() -> str | None:
    """PostgreSQL refuses to run as root: under root, run it as a dedicated system user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", _PG_USER], check=True, capture_output=True
        )
    return _PG_USER


@dataclass(frozen=True)
class PostgresTLS:
    """The certificate and key the server's TLS front presents (stack.pgtls), and the CA its
    clients verify it against (`sslmode=verify-full&sslrootcert=`, in `EmbeddedPostgres.url`)."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def url_query(self) -> str:
        return f"sslmode=verify-full&sslrootcert={quote(str(self.ca_file), safe='/')}"


def start_tls_front(
    port: int, upstream_socket: Path, tls: PostgresTLS, log_path: Path, *, timeout: float = 60
) -> subprocess.Popen[bytes]:
    """`python -m stack.pgtls` on 127.0.0.1:`port` in front of a server's Unix socket, once it
    listens; it exits with this process (and on SIGTERM)."""
    with open(log_path, "ab") as log:
        front = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stack.pgtls",
                *("--listen", f"127.0.0.1:{port}"),
                *("--upstream-socket", str(upstream_socket)),
                *("--cert-file", str(tls.cert_file), "--key-file", str(tls.key_file)),
                "--exit-with-parent",  # a stack killed outright leaves no front behind
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a signal to the server's group never reaches it
            cwd=Path(__file__).resolve().parents[2],  # the project root
        )
    wait_for_port(port, timeout=timeout, what="PostgreSQL's TLS front", proc=front)
    return front


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL 16 cluster (from pgserver's binaries) on 127.0.0.1:port, trust auth.

    With `tls`, the server itself listens on its Unix socket only and its TLS front
    (`python -m stack.pgtls`, a child of this object) takes 127.0.0.1:port: every TCP client
    speaks TLS and verifies the server (pgserver's build has no SSL of its own). The front is
    started and stopped with the server; a server killed by a signal leaves it running, and
    its connections then close at once, as the server's own port would refuse them."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    fast: bool = False  # tests only: fsync off; a clean stop still loses nothing
    #: more `-c name=value` settings, after the others (the last one wins): stack.replication
    extra_options: tuple[str, ...] = ()
    tls: PostgresTLS | None = None
    _front: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = pg_data_dir(self.data_dir)
        if self.data_dir.parent.name.startswith("payouts-pgdata-"):
            self.data_dir.parent.mkdir(mode=0o755, parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        query = f"?{self.tls.url_query()}" if self.tls else ""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres{query}"

    @property
    def socket_path(self) -> Path:
        """The server's Unix socket (always there; with `tls`, its only listener)."""
        return self.data_dir / f".s.PGSQL.{self.port}"

    @property
    def front_pid(self) -> int | None:
        """The TLS front's pid while it runs (None without `tls`)."""
        front = self._front
        return front.pid if front is not None and front.poll() is None else None

    @property
    def front_log_path(self) -> Path:
        """The TLS front's log (JSON lines, common.logs), beside the server's."""
        return self.data_dir.parent / f"{self.data_dir.name}-tls.json"

    @property
    def log_path(self) -> Path:
        """The server's log, one JSON object per line from the first (`log_destination =
        jsonlog`, through PostgreSQL's logging collector), as every service log of a stack is."""
        return self.data_dir.parent / f"{self.data_dir.name}.json"

    @property
    def startup_log_path(self) -> Path:
        """Text: what the postmaster writes to stderr before its logging collector takes over (a
        failed start's reason, and the collector's two lines saying it has taken over), read
        back when a start fails. It is also the collector's stderr-format file, which stays
        silent (jsonlog is the only destination)."""
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def run_as_server_user(self, args: list[str], timeout: float = 60) -> None:
        """Run one of PostgreSQL's programs on this cluster (initdb, pg_ctl, pg_basebackup) as the
        server's system user; a failure raises EmbeddedServerError with the program's stderr and
        the tail of `startup_log_path`."""
        user = _pg_system_user()
        try:
            subprocess.run(args, check=True, capture_output=True, timeout=timeout, user=user)
        except subprocess.CalledProcessError as exc:
            startup = self.startup_log_path
            log = startup.read_text(errors="replace")[-2000:] if startup.exists() else ""
            raise EmbeddedServerError(
                f"{' '.join(args[:2])} failed: {exc.stderr.decode(errors='replace')}\n{log}"
            ) from exc

    def give_to_server_user(self, path: Path) -> None:
        """Make `path` the server's system user's (only under root: the server then runs as that
        user and must own its data directory and append to its logs)."""
        user = _pg_system_user()
        if user is not None:
            shutil.chown(path, user=user)

    def init(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.give_to_server_user(self.data_dir)
        self.run_as_server_user(
            [
                pg_bin("initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            ]
        )

    def start(self, timeout: float = 60) -> str:
        """Start (initialising on first use) and return the connection URL."""
        self.init()
        front_up = self._front is not None and self._front.poll() is None
        if not front_up and port_is_open(self.port):
            raise EmbeddedServerError(
                f"port {self.port} for embedded PostgreSQL is taken; set DATABASE_URL to use that "
                "server, or free the port"
            )
        # The server runs as its own system user when we are root: it must be able to append to
        # its log files, in a folder it cannot write (its collector's stderr-format file too).
        for path in (self.startup_log_path, self.log_path):
            path.touch()
            self.give_to_server_user(path)
        # With TLS the server takes no TCP address at all: its front does (start_front).
        listen = "''" if self.tls else "127.0.0.1"
        opts = f"-h {listen} -p {self.port} -k {self.data_dir} -c max_connections=400"
        # jsonlog names its file after log_filename with ".log" replaced by ".json": log_path.
        opts += (
            f" -c logging_collector=on -c log_destination=jsonlog"
            f" -c log_directory={self.data_dir.parent} -c log_filename={self.data_dir.name}.log"
        )
        if self.fast:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        opts += "".join(f" -c {o}" for o in self.extra_options)
        self.run_as_server_user(
            [
                pg_bin("pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.startup_log_path),
                "-w",
                "-t",
                str(int(timeout)),
                "-o",
                opts,
                "start",
            ],
            timeout=timeout + 5,
        )
        if self.tls and not front_up:
            self._start_front(timeout)
        wait_for_port(self.port, timeout=timeout, what="embedded PostgreSQL")
        return self.url

    def _start_front(self, timeout: float) -> None:
        assert self.tls is not None
        self._front = start_tls_front(
            self.port, self.socket_path, self.tls, self.front_log_path, timeout=timeout
        )

    def stop_front(self) -> None:
        """Stop the TLS front (if any); the server itself is not touched."""
        front, self._front = self._front, None
        if front is None or front.poll() is not None:
            return
        front.terminate()
        try:
            front.wait(timeout=10)
        except subprocess.TimeoutExpired:
            front.kill()
            front.wait()

    def stop(self, mode: str = "fast") -> None:
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self.run_as_server_user(
                    [pg_bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-m", mode, "stop"]
                )
        finally:
            self.stop_front()

    def is_running(self) -> bool:
        """Whether the server itself accepts connections (on its socket: with `tls`, the TCP
        port belongs to the front, which outlives a killed server)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            return s.connect_ex(str(self.socket_path)) == 0
