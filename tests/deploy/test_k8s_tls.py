"""deploy/k8s_tls.py, the GKE deployment's certificates (docs/deploy-gcp.md, "TLS"), run as the
docs run it; each certificate is then used in a real TLS handshake (in memory, no network) with
the contexts the components build (common.tls), for the names the manifests' clients use; the
workers' and the outbox's metrics servers serve theirs on loopback to a Prometheus-like client."""

from __future__ import annotations

import runpy
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from prometheus_client import CollectorRegistry

from activities import worker_http
from common.tls import client_context, server_context
from outbox.service import serve_metrics
from tests.deploy.conftest import ROOT, scrape

SCRIPT = ROOT / "deploy" / "k8s_tls.py"
k8s_tls = runpy.run_path(str(SCRIPT))  # a script, not a package module (like gen_env.py)
CERTS = k8s_tls["CERTS"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' two commands, as written (relative --dir tls)."""
    cwd = tmp_path_factory.mktemp("operator")
    assert run("ca", "--dir", "tls", cwd=cwd).returncode == 0
    result = run("issue", "--dir", "tls", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return cwd / "tls"


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> None:
    """A full TLS handshake between the two contexts over memory BIOs; raises ssl.SSLError
    (e.g. SSLCertVerificationError) as a real connection would."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, obj, out, peer_in in (("c", cli, c_out, s_in), ("s", srv, s_out, c_in)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            data = out.read()
            if data:
                peer_in.write(data)
        if all(done.values()):
            # TLS 1.3: the server verifies a client certificate after its own handshake ends;
            # an exchange of application data surfaces a refusal.
            cli.write(b"ping")
            s_in.write(c_out.read())
            assert srv.read(4) == b"ping"
            return
    raise AssertionError("handshake did not finish")


def files(directory: Path, name: str) -> tuple[str, str]:
    return str(directory / f"{name}.pem"), str(directory / f"{name}.key")


def test_files_are_private_and_the_ca_is_never_overwritten(issued: Path) -> None:
    assert issued.stat().st_mode & 0o777 == 0o700
    for key in issued.glob("*.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
    assert {p.stem for p in issued.glob("*.pem")} == {"ca", *CERTS}
    again = run("ca", "--dir", "tls", cwd=issued.parent)
    assert again.returncode == 2 and "already holds a CA" in again.stderr
    assert run("issue", "--dir", "tls", "nosuch", cwd=issued.parent).returncode == 2
    shown = run("show", "--dir", "tls", cwd=issued.parent).stdout
    assert shown.count("signed by this CA") == len(CERTS) and "NOT" not in shown
    assert "PRIVATE KEY" not in shown


@pytest.mark.parametrize(
    "name", ["lock-server", "railproxy", "railstub", "finledger", "worker", "outbox"]
)
def test_each_server_is_verified_by_its_in_cluster_names_only(issued: Path, name: str) -> None:
    server = server_context(*files(issued, name))
    client = client_context(str(issued / "ca.pem"))
    for host in (name, f"{name}.payouts.svc", f"{name}.payouts.svc.cluster.local"):
        handshake(server, client, host)
    # Negative controls: another service's name, and a client trusting another CA.
    other = "railstub" if name != "railstub" else "railproxy"
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client, other)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(str(issued / f"{other}.pem")), name)


def test_the_metrics_endpoints_serve_their_certificates_to_prometheus(issued: Path) -> None:
    """The workers' and the outbox's own servers (worker_http with common.tls; the publisher's
    outbox.service.serve_metrics) loaded with the issued
    files answer a client that verifies the name of their Prometheus job's server_name."""
    ca = issued / "ca.pem"
    worker = worker_http.serve(
        worker_http.HealthSnapshot(), 0, tls=server_context(*files(issued, "worker"))
    )
    cert, key = files(issued, "outbox")
    outbox = serve_metrics(0, CollectorRegistry(), server_context(cert, key))
    try:
        worker_port, outbox_port = worker.server_address[1], outbox.server_port
        assert scrape(worker_port, "/metrics", ca, "worker.payouts.svc").startswith(b"HTTP/1.0 200")
        assert (  # answered over TLS: "starting", its loop has not refreshed it
            b" 503 " in scrape(worker_port, "/health", ca, "worker.payouts.svc").split(b"\r\n")[0]
        )
        assert scrape(outbox_port, "/metrics", ca, "outbox.payouts.svc").startswith(b"HTTP/1.0 200")
        # Negative controls: each serves its own certificate, not one for another job's name.
        with pytest.raises(ssl.SSLCertVerificationError):
            scrape(worker_port, "/metrics", ca, "outbox.payouts.svc")
        with pytest.raises(ssl.SSLCertVerificationError):
            scrape(outbox_port, "/metrics", ca, "worker.payouts.svc")
    finally:
        worker.shutdown()
        worker.server_close()
        outbox.shutdown()
        outbox.server_close()


def test_otel_collector_is_verified_by_the_exporters_url(issued: Path) -> None:
    server = server_context(*files(issued, "otel-collector"))
    handshake(
        server, client_context(str(issued / "ca.pem")), "otel-collector.payouts.svc.cluster.local"
    )


def mutual(issued: Path, ca: Path) -> ssl.SSLContext:
    """etcd's listener: its member certificate, and --client-cert-auth against `ca`."""
    ctx = server_context(*files(issued, "etcd"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(str(ca))
    return ctx


def test_etcd_members_serve_and_present_one_certificate_clients_and_peers_accept(
    issued: Path,
) -> None:
    ca = issued / "ca.pem"
    lock = client_context(
        str(ca),
        cert_file=files(issued, "lock-server-etcd-client")[0],
        key_file=files(issued, "lock-server-etcd-client")[1],
    )
    peer = client_context(
        str(ca), cert_file=files(issued, "etcd")[0], key_file=files(issued, "etcd")[1]
    )
    for member in ("etcd-0", "etcd-1", "etcd-2"):
        # the lock server's endpoints (LOCK_ETCD_ENDPOINTS) and the peer URLs
        handshake(mutual(issued, ca), lock, f"{member}.etcd")
        handshake(mutual(issued, ca), peer, f"{member}.etcd.payouts.svc.cluster.local")
    handshake(mutual(issued, ca), peer, "127.0.0.1")  # etcdctl inside a member's pod
    # Negative control: a client without a certificate is refused by --client-cert-auth.
    with pytest.raises(ssl.SSLError):
        handshake(mutual(issued, ca), client_context(str(ca)), "etcd-0.etcd")


def test_key_usages_say_who_serves_and_who_is_a_client(issued: Path) -> None:
    for name, leaf in CERTS.items():
        cert = x509.load_pem_x509_certificate((issued / f"{name}.pem").read_bytes())
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert (ExtendedKeyUsageOID.SERVER_AUTH in usages) == leaf.server, name
        assert (ExtendedKeyUsageOID.CLIENT_AUTH in usages) == leaf.client, name
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        assert basic.ca is False, name


def test_a_ca_bundle_of_two_cas_accepts_both_during_a_rotation(
    issued: Path, tmp_path: Path
) -> None:
    """docs/deploy-gcp.md, CA rotation: clients trust old + new, servers switch one by one."""
    assert run("ca", "--dir", "tls-new", cwd=tmp_path).returncode == 0
    assert run("issue", "--dir", "tls-new", "lock-server", cwd=tmp_path).returncode == 0
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(
        (issued / "ca.pem").read_bytes() + (tmp_path / "tls-new/ca.pem").read_bytes()
    )
    client = client_context(str(bundle))
    handshake(server_context(*files(issued, "lock-server")), client, "lock-server")
    handshake(server_context(*files(tmp_path / "tls-new", "lock-server")), client, "lock-server")
    with pytest.raises(ssl.SSLCertVerificationError):  # the old CA alone refuses the new one
        handshake(
            server_context(*files(tmp_path / "tls-new", "lock-server")),
            client_context(str(issued / "ca.pem")),
            "lock-server",
        )


def test_the_docs_give_the_commands_this_file_runs() -> None:
    """The commands above are the docs' own (docs/deploy-gcp.md, "Creating the certificates")."""
    doc = (ROOT / "docs" / "deploy-gcp.md").read_text()
    for args in ("ca --dir tls", "issue --dir tls", "show --dir tls", "ca --dir tls-new"):
        assert f".venv/bin/python deploy/k8s_tls.py {args}\n" in doc, args
