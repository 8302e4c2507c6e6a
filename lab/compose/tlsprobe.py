"""`python -m lab.compose.tlsprobe`: what a client on the compose network gets from each server,
run inside the running compose stack by `make compose-smoke` (the `operator` tool service).

Owns: per server of docker-compose.yml (the four HTTP APIs, the outbox publisher's /metrics and
one worker's /metrics: the name `worker` resolves to one of its replicas, which all serve the
same certificate), three connections and what each must get: plaintext
(refused: no HTTP answer, no gRPC frame, PostgreSQL's startup refused), TLS trusting another CA
(refused: the server's certificate does not verify), and TLS trusting the deployment's CA
(the positive control: the server answers; etcd also asks for a client certificate, so a client
without one is refused and the operator's own is accepted). Prints one JSON line (each check's
outcome) and exits 0 only if every refusal and every control held.
Must never: send a credential (no token, no password: the PostgreSQL startup names a user and
stops at the server's first answer), change anything, or pass a check it could not run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import struct
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from stack.pki import StackPKI

CA = "/run/secrets/tls-ca"
CLIENT_CERT = ("/run/tls/cert.pem", "/run/tls/key.pem")  # the operator's (etcd's client auth)
#: (host, port, path): our HTTP servers, each asked for a path it serves.
HTTP_SERVERS = (
    ("lock-server", 8701, "/health"),
    ("railstub", 8710, "/health"),
    ("railproxy", 8720, "/health"),
    ("finledger", 8730, "/health"),
    ("outbox", 9101, "/metrics"),
    ("worker", 9100, "/metrics"),
)
TIMEOUT_S = 10.0
SSL_REQUEST = struct.pack("!II", 8, 80877103)


def _context(ca_file: str, client: tuple[str, str] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file)
    if client:
        ctx.load_cert_chain(*client)
    return ctx


def http_status(host: str, port: int, ctx: ssl.SSLContext | None, path: str = "/health") -> int:
    """The HTTP status of GET path, over TLS with `ctx` or plaintext without; raises when the
    server gives no HTTP answer (a refused handshake, a closed connection)."""
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=ctx)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def tls_handshake(host: str, port: int, ctx: ssl.SSLContext, alpn: str | None = None) -> str:
    """Complete a TLS handshake (verifying the server with `ctx`); the negotiated ALPN."""
    if alpn:
        ctx.set_alpn_protocols([alpn])
    with (
        socket.create_connection((host, port), timeout=TIMEOUT_S) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        return tls.selected_alpn_protocol() or ""


def grpc_plaintext_answer(host: str, port: int) -> bytes:
    """Bytes a plaintext HTTP/2 (gRPC) client gets back for its connection preface."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as s:
        s.sendall(preface)
        try:
            return s.recv(64)
        except (ConnectionError, TimeoutError):
            return b""


def _startup(user: str, database: str) -> bytes:
    params = b"user\0" + user.encode() + b"\0database\0" + database.encode() + b"\0\0"
    return struct.pack("!II", 8 + len(params), 196608) + params


def pg_plaintext_answer(host: str, port: int) -> bytes:
    """The first message type a plaintext PostgreSQL startup gets: b"E" is a refusal, b"R" an
    authentication request (the server would let the login go on unencrypted)."""
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as s:
        s.sendall(_startup("payouts_checker", "payouts"))
        try:
            return s.recv(1)
        except (ConnectionError, TimeoutError):
            return b""


def pg_tls_handshake(host: str, port: int, ctx: ssl.SSLContext) -> None:
    """PostgreSQL's negotiation (SSLRequest, `S`), then a verified TLS handshake; raises if the
    server declines TLS or its certificate does not verify."""
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as raw:
        raw.sendall(SSL_REQUEST)
        answer = raw.recv(1)
        if answer != b"S":
            raise ssl.SSLError(f"the server answered {answer!r} to SSLRequest, not b'S'")
        with ctx.wrap_socket(raw, server_hostname=host):
            pass


def _refused(check: Callable[[], object]) -> str:
    """'refused: <why>' when the check raises a connection or TLS error, else what it returned."""
    try:
        got = check()
    except (ssl.SSLError, OSError, http.client.HTTPException) as exc:
        return f"refused: {type(exc).__name__}: {exc}"[:200]
    return f"answered: {got!r}"[:200]


def probe(ca_file: str, client_cert: tuple[str, str], other_ca: str) -> dict[str, dict[str, str]]:
    """Every check's outcome, by server."""
    ours, other = _context(ca_file), _context(other_ca)
    out: dict[str, dict[str, str]] = {}
    for host, port, path in HTTP_SERVERS:
        out[host] = {
            "plaintext": _refused(partial(http_status, host, port, None, path)),
            "other_ca": _refused(partial(http_status, host, port, other, path)),
            "our_ca": _refused(partial(http_status, host, port, ours, path)),
        }
    out["etcd-0"] = {
        "plaintext": _refused(partial(http_status, "etcd-0", 2379, None)),
        "other_ca": _refused(partial(http_status, "etcd-0", 2379, _context(other_ca, client_cert))),
        "no_client_cert": _refused(partial(http_status, "etcd-0", 2379, ours)),
        "our_ca": _refused(partial(http_status, "etcd-0", 2379, _context(ca_file, client_cert))),
    }
    out["temporal"] = {
        "plaintext": _refused(partial(grpc_plaintext_answer, "temporal", 7233)),
        "other_ca": _refused(partial(tls_handshake, "temporal", 7233, _context(other_ca), "h2")),
        "our_ca": _refused(partial(tls_handshake, "temporal", 7233, _context(ca_file), "h2")),
    }
    out["postgres"] = {
        "plaintext": _refused(partial(pg_plaintext_answer, "postgres", 5432)),
        "other_ca": _refused(partial(pg_tls_handshake, "postgres", 5432, other)),
        "our_ca": _refused(partial(pg_tls_handshake, "postgres", 5432, ours)),
    }
    return out


def verdicts(results: dict[str, dict[str, str]]) -> list[str]:
    """What did not hold: each refusal must be one, each control must have answered as it
    should (an HTTP status, ALPN h2, a completed PostgreSQL handshake)."""
    bad = []
    for server, checks in results.items():
        for name, outcome in checks.items():
            if name == "our_ca":
                want = {"temporal": "answered: 'h2'", "postgres": "answered: None"}.get(server)
                ok = outcome == want if want else outcome.startswith("answered: ")
            elif name == "plaintext" and server == "temporal":
                # the TLS front drops a plaintext preface: nothing back, or no HTTP/2 frame
                ok = outcome.startswith("refused") or outcome == "answered: b''"
            elif name == "plaintext" and server == "etcd-0":
                # Go's TLS listener answers a plaintext HTTP request with a bare 400 ("Client sent
                # an HTTP request to an HTTPS server") and closes: nothing is served either way
                ok = outcome.startswith("refused") or outcome == "answered: 400"
            elif name == "plaintext" and server == "postgres":
                ok = outcome.startswith("refused") or outcome in ("answered: b'E'", "answered: b''")
            else:
                ok = outcome.startswith("refused")
            if not ok:
                bad.append(f"{server} {name}: {outcome}")
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.compose.tlsprobe", description=__doc__)
    parser.add_argument("--ca-file", default=CA, help="the deployment's CA (compose secret)")
    parser.add_argument("--cert-file", default=CLIENT_CERT[0], help="an etcd client certificate")
    parser.add_argument("--key-file", default=CLIENT_CERT[1], help="its key")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="other-ca-") as tmp:
        other_ca = StackPKI(Path(tmp)).ensure_ca()  # a CA that issued none of the servers' certs
        results = probe(args.ca_file, (args.cert_file, args.key_file), str(other_ca))
    bad = verdicts(results)
    sys.stdout.write(json.dumps({"tls_probe": results, "failed": bad}, sort_keys=True) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
