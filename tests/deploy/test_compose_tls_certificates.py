"""Each compose service mounts only its own certificate, which deploy/gen_env.py issues and the
`tls` job installs readable by that service only (the real script, run here), the metrics
endpoints serve the issued certificates, and the compose smoke run's probe tells a refusal from
an answer on every HTTP server of ours (`make compose-smoke` proves the same for real), each
check with a negative control."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import ssl
import stat
import subprocess
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography import x509

from tests.deploy.compose_servers import SERVERS, strings
from tests.deploy.conftest import ROOT, compose, scrape

SCRIPT = ROOT / "deploy" / "compose" / "install-tls.sh"


def gen_env() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_env", ROOT / "deploy" / "gen_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- certificates: issued, installed, each service only its own ----------------------------


def installed_by_script() -> dict[str, str]:
    """service -> the certificate name the tls job installs into its volume."""
    return {
        svc: cert
        for svc, _, cert in re.findall(r"^put (\S+) (\d+) (\S+)$", SCRIPT.read_text(), re.M)
    }


def mount_problems(services: dict[str, Any]) -> list[str]:
    """Each service mounts at most its own tls volume, read-only at /run/tls, and only the tls
    job mounts them writable; every /run/tls path a service names is in its own volume."""
    installed = installed_by_script()
    problems = []
    for name, svc in services.items():
        mounts = [str(v) for v in svc.get("volumes") or [] if str(v).startswith("tls-")]
        if name == "tls":
            if sorted(mounts) != sorted(f"tls-{s}:/dst/{s}" for s in installed):
                problems.append(f"tls: mounts {mounts}")
            continue
        texts = strings(svc.get("environment")) + strings(svc.get("command"))
        texts += strings(svc.get("healthcheck"))
        names_own = any("/run/tls/" in t for t in texts)
        if (names_own or mounts) and mounts != [f"tls-{name}:/run/tls:ro"]:
            problems.append(f"{name}: mounts {mounts}, not only its own certificate read-only")
        if mounts and installed.get(name) != name:
            problems.append(f"{name}: the tls job installs no certificate of its own for it")
        if mounts and svc.get("depends_on", {}).get("tls") != {
            "condition": "service_completed_successfully"
        }:
            problems.append(f"{name}: starts before the tls job has installed its certificate")
    return problems


def test_each_service_mounts_only_its_own_certificate() -> None:
    services = compose()["services"]
    assert mount_problems(services) == []
    assert set(installed_by_script()) == set(gen_env().TLS_SERVICES)
    bad = copy.deepcopy(services)
    bad["railproxy"]["volumes"].append("tls-lock-server:/run/lock-tls:ro")
    # The worker names /run/tls/ without its volume; the outbox starts before the tls job.
    bad["worker"]["volumes"].remove("tls-worker:/run/tls:ro")
    del bad["outbox"]["depends_on"]["tls"]
    assert sorted(mount_problems(bad)) == [
        "outbox: starts before the tls job has installed its certificate",
        "railproxy: mounts ['tls-railproxy:/run/tls:ro', 'tls-lock-server:/run/lock-tls:ro'], "
        "not only its own certificate read-only",
        "worker: mounts [], not only its own certificate read-only",
    ]


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secrets") / "tls"
    gen_env().write_tls(folder)
    return folder


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_gen_env_issues_a_ca_and_a_certificate_per_service_once(issued: Path) -> None:
    assert mode(issued) == 0o700 and mode(issued / "ca.key") == 0o600
    assert mode(issued / "ca.pem") == 0o644  # public: the compose secret tls-ca
    ca_cert = x509.load_pem_x509_certificate((issued / "ca.pem").read_bytes())
    for name in gen_env().TLS_SERVICES:
        assert mode(issued / f"{name}.key") == 0o600, name
        cert = x509.load_pem_x509_certificate((issued / f"{name}.pem").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {name, "localhost"} <= set(sans.get_values_for_type(x509.DNSName)), name
        cert.verify_directly_issued_by(ca_cert)  # signed by the CA (raises otherwise)
    before = {p.name: p.read_bytes() for p in issued.iterdir()}
    gen_env().write_tls(issued)
    assert {p.name: p.read_bytes() for p in issued.iterdir()} == before, "a second run re-issued"
    gen_env().write_tls(issued, reissue=True)
    after = {p.name: p.read_bytes() for p in issued.iterdir()}
    assert (
        after["ca.pem"] == before["ca.pem"]
        and after["lock-server.pem"] != before["lock-server.pem"]
    )
    gen_env().write_tls(issued, new_ca=True)
    assert (issued / "ca.pem").read_bytes() != before["ca.pem"]


def test_tls_job_installs_each_services_files_readable_by_it_only(
    issued: Path, tmp_path: Path
) -> None:
    """The real script, run as this user (the job runs it as root, chowning to each image's uid)."""
    dst = tmp_path / "dst"
    subprocess.run(["sh", str(SCRIPT), str(issued), str(dst), str(os.getuid())], check=True)
    for service, cert in installed_by_script().items():
        assert sorted(p.name for p in (dst / service).iterdir()) == ["cert.pem", "key.pem"]
        assert mode(dst / service) == 0o700
        assert (
            mode(dst / service / "key.pem") == 0o400 and mode(dst / service / "cert.pem") == 0o444
        )
        assert (dst / service / "key.pem").read_bytes() == (issued / f"{cert}.key").read_bytes()
    # The uids it installs as are the images' own (project 10001, postgres 999, temporal 1000,
    # etcd root, prometheus nobody).
    uids = {
        svc: int(uid)
        for svc, uid, _ in re.findall(r"^put (\S+) (\d+) (\S+)$", SCRIPT.read_text(), re.M)
    }
    assert uids["lock-server"] == 10001 and uids["postgres"] == 999 and uids["temporal"] == 1000
    assert uids["etcd-0"] == 0 and uids["prometheus"] == 65534


def test_the_metrics_endpoints_serve_the_issued_certificates(issued: Path, tmp_path: Path) -> None:
    """The workers' and the outbox's real servers (worker_http with common.tls; the publisher's
    outbox.service.serve_metrics) given the files gen_env
    issues for them: the healthcheck's https://127.0.0.1 URL verifies against the CA
    (common.healthcheck with HEALTHCHECK_CA_FILE), the name Prometheus checks (the worker job's
    server_name `worker`, the outbox's host `outbox`) verifies, and a plaintext client and one
    trusting another CA are refused (lab.compose.tlsprobe's clients). Negative control: each
    serves its own certificate, not one for the other's name."""
    from prometheus_client import CollectorRegistry

    from activities import worker_http
    from common.healthcheck import check
    from common.tls import server_context
    from lab.compose import tlsprobe as probe
    from outbox.service import serve_metrics
    from stack.pki import StackPKI

    ca = issued / "ca.pem"
    worker = worker_http.serve(
        worker_http.HealthSnapshot(),
        0,
        tls=server_context(str(issued / "worker.pem"), str(issued / "worker.key")),
    )
    outbox = serve_metrics(
        0,
        CollectorRegistry(),
        server_context(str(issued / "outbox.pem"), str(issued / "outbox.key")),
    )
    other = probe._context(str(StackPKI(tmp_path / "other").ensure_ca()))
    try:
        ports = {"worker": worker.server_address[1], "outbox": outbox.server_port}
        for name, port in ports.items():
            assert check(f"https://127.0.0.1:{port}/metrics", ca_file=str(ca)) is None, name
            assert scrape(port, "/metrics", ca, name).startswith(b"HTTP/1.0 200"), name
            plain = probe._refused(partial(probe.http_status, "127.0.0.1", port, None, "/metrics"))
            wrong = probe._refused(partial(probe.http_status, "localhost", port, other, "/metrics"))
            assert plain.startswith("refused"), (name, plain)
            assert "CERTIFICATE_VERIFY_FAILED" in wrong, (name, wrong)
        with pytest.raises(ssl.SSLCertVerificationError):
            scrape(ports["worker"], "/metrics", ca, "outbox")
        with pytest.raises(ssl.SSLCertVerificationError):
            scrape(ports["outbox"], "/metrics", ca, "worker")
    finally:
        worker.shutdown()
        worker.server_close()
        outbox.shutdown()
        outbox.server_close()


# --- the compose smoke run's probe (lab.compose.tlsprobe), against a local TLS server ---------


def test_the_probe_tells_a_refusal_from_an_answer(tmp_path: Path) -> None:
    """What `make compose-smoke` runs inside the stack, here against one https server of a test
    CA: plaintext and another CA are refused, the server's own CA is answered; and the verdicts
    call a plaintext answer a failure (negative control)."""
    import http.server
    import threading

    from lab.compose import tlsprobe as probe
    from stack.pki import StackPKI

    pki, other = StackPKI(tmp_path / "ours"), StackPKI(tmp_path / "other")
    files = pki.issue("localhost")

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.cert, files.key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    try:
        ours = probe._context(str(pki.ca_file))
        theirs = probe._context(str(other.ensure_ca()))
        plain = probe._refused(partial(probe.http_status, "localhost", port, None))
        wrong = probe._refused(partial(probe.http_status, "localhost", port, theirs))
        right = probe._refused(partial(probe.http_status, "localhost", port, ours))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert plain.startswith("refused") and "CERTIFICATE_VERIFY_FAILED" in wrong, (plain, wrong)
    assert right == "answered: 200"
    results = {"lock-server": {"plaintext": plain, "other_ca": wrong, "our_ca": right}}
    assert probe.verdicts(results) == []
    results["lock-server"]["plaintext"] = "answered: 200"
    assert probe.verdicts(results) == ["lock-server plaintext: answered: 200"]


def test_the_probe_covers_every_http_server_of_ours_on_its_compose_port() -> None:
    """The smoke's in-stack refusals include each server of SERVERS (the outbox's and a worker's
    metrics endpoints too), on the port its compose service serves."""
    from lab.compose import tlsprobe as probe

    services = compose()["services"]
    assert {host for host, _, _ in probe.HTTP_SERVERS} == set(SERVERS)
    for host, port, path in probe.HTTP_SERVERS:
        url = str(services[host]["environment"]["HEALTHCHECK_URL"])
        assert url.startswith(f"https://127.0.0.1:{port}/"), (host, url)
        assert path in ("/health", "/metrics"), (host, path)
