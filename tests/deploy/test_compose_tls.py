"""docker-compose.yml encrypts and verifies every connection between its services (issue 27 §1),
statically: every component DSN is `sslmode=verify-full` against the deployment's CA, every URL
that names another compose service is https (etcd's endpoints and its own flags too), every
client of Temporal sets the CA, every HTTP server of ours (the workers' and the outbox's metrics
endpoints too) is given its certificate and health-checked over https, Prometheus scrapes them
and etcd over https for a name of their certificates (only the Temporal SDK's exporter and
Temporal's metrics plain), and each service mounts only its own certificate volume, which the
`tls` job fills from what deploy/gen_env.py issued (the real script, run here). Each check has a
negative control. `make compose-smoke` proves the same for real (a plaintext request and a
client trusting another CA refused).
"""

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
from urllib.parse import parse_qs

import pytest
import yaml
from cryptography import x509

from tests.deploy.conftest import ROOT, compose, scrape

CA = "/run/secrets/tls-ca"
SCRIPT = ROOT / "deploy" / "compose" / "install-tls.sh"
#: The HTTP servers of ours and the variables that hand each its certificate (common.tls): the
#: four APIs, the workers' /metrics and /health (every replica, one certificate) and the outbox
#: publisher's /metrics (prometheus_client's certfile/keyfile).
SERVERS = {
    "lock-server": "LOCK_",
    "railstub": "RAILSTUB_",
    "railproxy": "RAILPROXY_",
    "finledger": "FINLEDGER_",
    "worker": "WORKER_",
    "outbox": "OUTBOX_",
}
#: Scrape jobs of endpoints that are plain HTTP by design: the Temporal SDK's exporter (its
#: PrometheusConfig takes no certificate) and Temporal's own metrics.
PLAIN_JOBS = {"worker-sdk", "temporal"}
URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^/\s,:@]+(?::[^/\s,@]*)?@)?([A-Za-z0-9_.-]+)")


def gen_env() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_env", ROOT / "deploy" / "gen_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def tls_problems(services: dict[str, Any]) -> list[str]:
    """What in the services' settings would cross the compose network unencrypted or unverified."""
    names = set(services)
    problems: list[str] = []
    for name, svc in services.items():
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        secrets = set(svc.get("secrets") or ())
        for var, value in env.items():
            if value.startswith("postgresql://"):
                # after the last `?`: the interpolation `${X:?run make compose-env}` has one too
                query = parse_qs(value.rsplit("?", 1)[-1])
                if query.get("sslmode") != ["verify-full"] or query.get("sslrootcert") != [CA]:
                    problems.append(f"{name}: {var} is not sslmode=verify-full against {CA}")
        # Every URL naming another compose service, wherever it is written (environment,
        # command, healthcheck), is https; so are the etcd endpoints, written without a scheme.
        texts = _strings(svc.get("environment")) + _strings(svc.get("command"))
        for text in texts:
            for scheme, _, host in URL.findall(text):
                if host in names and scheme not in ("https", "postgresql"):
                    problems.append(f"{name}: {scheme}://{host} is not https")
        for var, value in env.items():
            if var.endswith("ETCD_ENDPOINTS") and any(
                not e.startswith("https://") for e in value.split(",")
            ):
                problems.append(f"{name}: {var} has a plaintext endpoint")
        uses_ca = any(CA in t for t in texts + _strings(svc.get("healthcheck")))
        if uses_ca and "tls-ca" not in secrets:
            problems.append(f"{name}: names {CA} without the secret tls-ca")
        if any(v.endswith("TEMPORAL_ADDRESS") for v in env) and not (
            env.get("TEMPORAL_TLS_SERVER_CA_CERT_PATH") == CA or env.get("TEMPORAL_TLS_CA") == CA
        ):
            problems.append(f"{name}: connects to Temporal without its CA")
    for name, prefix in SERVERS.items():
        env = services[name]["environment"]
        want = {
            f"{prefix}TLS_CERT_FILE": "/run/tls/cert.pem",
            f"{prefix}TLS_KEY_FILE": "/run/tls/key.pem",
        }
        if {k: env.get(k) for k in want} != want:
            problems.append(f"{name}: does not serve TLS with its own certificate")
        if not str(env.get("HEALTHCHECK_URL", "")).startswith("https://127.0.0.1:"):
            problems.append(f"{name}: its healthcheck is not https")
        if env.get("HEALTHCHECK_CA_FILE") != CA:
            problems.append(f"{name}: its healthcheck does not verify against the CA")
    return problems


def test_every_connection_in_the_compose_file_is_tls_and_verified() -> None:
    services = compose()["services"]
    assert tls_problems(services) == []
    dsns = [
        (n, v)
        for n, s in services.items()
        for v, value in (s.get("environment") or {}).items()
        if str(value).startswith("postgresql://")
    ]
    assert len(dsns) >= 9  # every component's, and the migrate job's admin DSN
    # Negative controls: each kind of gap is reported by name.
    bad = copy.deepcopy(services)
    env = bad["outbox"]["environment"]
    env["OUTBOX_DATABASE_URL"] = env["OUTBOX_DATABASE_URL"].replace("verify-full", "require")
    env["OUTBOX_FINLEDGER_URL"] = "http://finledger:8730"
    bad["lock-server"]["environment"]["LOCK_ETCD_ENDPOINTS"] = "etcd-0:2379"
    del bad["reconcile-schedule"]["environment"]["TEMPORAL_TLS_SERVER_CA_CERT_PATH"]
    del bad["railstub"]["environment"]["RAILSTUB_TLS_KEY_FILE"]
    # The metrics endpoints back on plain HTTP: the outbox without its certificate, a worker's
    # healthcheck plain again, the outbox's not verifying against the CA.
    del bad["outbox"]["environment"]["OUTBOX_TLS_CERT_FILE"]
    bad["worker"]["environment"]["HEALTHCHECK_URL"] = "http://127.0.0.1:9100/health"
    del bad["outbox"]["environment"]["HEALTHCHECK_CA_FILE"]
    bad["etcd-1"]["command"] = [
        c.replace("https://etcd-2", "http://etcd-2") for c in bad["etcd-1"]["command"]
    ]
    assert sorted(tls_problems(bad)) == sorted(
        [
            f"outbox: OUTBOX_DATABASE_URL is not sslmode=verify-full against {CA}",
            "outbox: http://finledger is not https",
            "lock-server: LOCK_ETCD_ENDPOINTS has a plaintext endpoint",
            "reconcile-schedule: connects to Temporal without its CA",
            "railstub: does not serve TLS with its own certificate",
            "outbox: does not serve TLS with its own certificate",
            "worker: its healthcheck is not https",
            "outbox: its healthcheck does not verify against the CA",
            "etcd-1: http://etcd-2 is not https",
        ]
    )


def test_etcd_members_require_client_and_peer_certificates() -> None:
    services = compose()["services"]
    for member in ("etcd-0", "etcd-1", "etcd-2"):
        flags = set(services[member]["command"])
        assert {"--client-cert-auth", "--peer-client-cert-auth"} <= flags, member
        assert {f"--trusted-ca-file={CA}", f"--peer-trusted-ca-file={CA}"} <= flags, member
    lock = services["lock-server"]["environment"]
    assert lock["LOCK_ETCD_CA_FILE"] == CA and lock["LOCK_ETCD_CERT_FILE"] == "/run/tls/cert.pem"


# --- Prometheus: every https endpoint scraped over TLS, for a name of its certificate ---------


def scraped_names(job: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(the compose service behind each target, the name the TLS handshake checks). A static
    target is checked for its host; a DNS-discovered one is scraped by address, so only a
    tls_config.server_name gives it a name."""
    tls = job.get("tls_config") or {}
    out: list[tuple[str, str | None]] = []
    for config in job.get("static_configs", []):
        for target in config["targets"]:
            host = target.rsplit(":", 1)[0]
            out.append((host, tls.get("server_name", host)))
    for config in job.get("dns_sd_configs", []):
        out += [(name, tls.get("server_name")) for name in config["names"]]
    return out


def scrape_problems(config: dict[str, Any]) -> list[str]:
    """Each job of our servers and etcd is https, verified against the CA for the name the
    certificate of the service behind it carries (gen_env issues each for its service name);
    the plain-by-design jobs stay plain."""
    problems = []
    for job in config["scrape_configs"]:
        name = job["job_name"]
        if name in PLAIN_JOBS:
            if job.get("scheme", "http") != "http":
                problems.append(f"{name}: scheme changed; its endpoint is plain HTTP by design")
            continue
        if job.get("scheme") != "https":
            problems.append(f"{name}: not scraped over https")
        if (job.get("tls_config") or {}).get("ca_file") != CA:
            problems.append(f"{name}: not verified against {CA}")
        if any(service != checked for service, checked in scraped_names(job)):
            problems.append(f"{name}: not scraped for a name of its certificate")
    return problems


def test_prometheus_scrapes_every_server_of_ours_and_etcd_over_tls() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    assert scrape_problems(config) == []
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(SERVERS) | {"etcd"} <= set(jobs)
    assert {n for n, j in jobs.items() if "scheme" not in j} == PLAIN_JOBS
    assert "tls-ca" in compose()["services"]["prometheus"]["secrets"]
    # Negative controls.
    bad = copy.deepcopy(config)
    for job in bad["scrape_configs"]:
        if job["job_name"] == "worker":  # by address, no name: the handshake would fail
            del job["tls_config"]["server_name"]
        if job["job_name"] == "outbox":
            del job["scheme"]
        if job["job_name"] == "lock-server":  # another service's name
            job["tls_config"]["server_name"] = "railstub"
        if job["job_name"] == "finledger":
            del job["tls_config"]
        if job["job_name"] == "worker-sdk":  # https to a plain exporter: every scrape fails
            job["scheme"] = "https"
    assert scrape_problems(bad) == [
        "lock-server: not scraped for a name of its certificate",
        "finledger: not verified against /run/secrets/tls-ca",
        "outbox: not scraped over https",
        "worker: not scraped for a name of its certificate",
        "worker-sdk: scheme changed; its endpoint is plain HTTP by design",
    ]


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
        texts = _strings(svc.get("environment")) + _strings(svc.get("command"))
        texts += _strings(svc.get("healthcheck"))
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
