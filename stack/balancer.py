"""The load balancer in front of a replicated stack's lock servers and rail proxies (issue 26 §1).

Owns: the HAProxy configuration the local stack runs when `replicas` > 1, and finding the
`haproxy` binary (Debian's package; `make haproxy` installs it). Must never: terminate TLS (it
passes each connection through to a replica, which serves its own certificate, so clients verify
the component they talk to, not the balancer), or start anything itself.

Why a real balancer and not endpoint lists in our SDKs: the manifests put every replicated
service behind a Kubernetes Service and compose behind one name, so a client sees ONE address
whose connections are spread over live replicas. HAProxy in TCP mode is that shape on one host:
connections are balanced, a replica that stops answering its health check (killed, or frozen by
SIGSTOP) is taken out within `inter * fall`, and a connection refused by a dead replica is
re-dispatched to another one (`retries`, `option redispatch`). A connection already open to a
replica that dies or freezes breaks or hangs exactly as it would behind a Service: the client's
own timeouts and the payout's recovery path deal with it, which is what the chaos faults test.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from stack.config import StackError

#: How often HAProxy probes each replica's /health, and after how many failed probes it takes
#: the replica out (or how many good ones bring it back): out within about 1 s of dying.
CHECK_INTERVAL_MS = 500
FALL = 2
RISE = 2
#: Idle limit of a balanced connection: longer than any request of ours (a lock acquire waits
#: at most its wait_s, a submit its deadline), so the balancer never cuts a live call.
IDLE_TIMEOUT = "10m"


@dataclass(frozen=True)
class Pool:
    """One balanced service: clients dial `port`, HAProxy forwards to the replicas' ports."""

    name: str
    port: int
    replicas: Sequence[tuple[str, int]]  # (replica name, port)


def _find_haproxy() -> str | None:
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def haproxy_available() -> bool:
    return _find_haproxy() is not None


def haproxy_binary() -> str:
    """The `haproxy` on PATH or in /usr/sbin (Debian puts it there, outside a user's PATH)."""
    found = _find_haproxy()
    if found is None:
        raise StackError(
            "haproxy is not installed, and a replicated stack (replicas > 1) balances its lock "
            "servers and rail proxies with it: run `make haproxy` (Debian's package), or run "
            "one replica of each (--replicas 1)"
        )
    return found


def render(pools: Sequence[Pool], *, ca_file: Path | None) -> str:
    """The configuration for `pools`; with `ca_file`, health checks speak TLS and verify each
    replica's certificate against the stack's CA, as any client does."""
    check_tls = f" check-ssl verify required ca-file {ca_file}" if ca_file else ""
    lines = [
        "# Written by the local stack (stack/balancer.py); replaced at every start.",
        "global",
        "    maxconn 4096",
        # Replicas going DOWN and UP, and failed connections; not every good connection.
        "    log stdout format raw local0 info",
        "defaults",
        "    mode tcp",
        "    log global",
        "    option tcplog",
        "    option dontlognull",
        "    option dontlog-normal",
        "    timeout connect 1s",
        f"    timeout client {IDLE_TIMEOUT}",
        f"    timeout server {IDLE_TIMEOUT}",
        "    timeout check 1s",
        # A connection refused by a replica that just died is tried on another one: nothing
        # was sent yet, so this retries no request, only the TCP connect.
        "    retries 2",
        "    option redispatch",
    ]
    for pool in pools:
        lines += [
            f"frontend {pool.name}",
            f"    bind 127.0.0.1:{pool.port}",
            f"    default_backend {pool.name}-replicas",
            f"backend {pool.name}-replicas",
            "    balance leastconn",
            "    option httpchk GET /health",
            "    http-check expect status 200",
            f"    default-server inter {CHECK_INTERVAL_MS}ms fall {FALL} rise {RISE}{check_tls}",
        ]
        lines += [f"    server {name} 127.0.0.1:{port} check" for name, port in pool.replicas]
    return "\n".join(lines) + "\n"


def write_config(path: Path, pools: Sequence[Pool], *, ca_file: Path | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(pools, ca_file=ca_file), encoding="utf-8")
    return path


def replica_names(service: str, count: int) -> list[str]:
    """`lock-server` for one replica (every single-replica stack keeps today's names), else
    `lock-server-1` .. `lock-server-N`."""
    return [service] if count == 1 else [f"{service}-{i}" for i in range(1, count + 1)]


def service_of(process: str, services: Collection[str]) -> str | None:
    """The service a process name belongs to (`railproxy-2` -> `railproxy`), or None."""
    if process in services:
        return process
    head, _, tail = process.rpartition("-")
    return head if head in services and tail.isdigit() else None
