"""docker-compose.yml encrypts and verifies every connection between its services (issue 27 §1),
statically: every component DSN is `sslmode=verify-full` against the deployment's CA, every URL
that names another compose service is https (etcd's endpoints and its own flags too), every
client of Temporal sets the CA, every HTTP server of ours is given its certificate and
health-checked over https, and Prometheus scrapes them and etcd over https for a name of their
certificates (only the Temporal SDK's exporter and Temporal's metrics plain), each check with a
negative control."""

from __future__ import annotations

import copy
import re
from typing import Any
from urllib.parse import parse_qs

import yaml

from tests.deploy.compose_servers import SERVERS, strings
from tests.deploy.conftest import ROOT, compose

CA = "/run/secrets/tls-ca"
#: Scrape jobs of endpoints that are plain HTTP by design: the Temporal SDK's exporter (its
#: PrometheusConfig takes no certificate) and Temporal's own metrics.
PLAIN_JOBS = {"worker-sdk", "temporal"}
URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^/\s,:@]+(?::[^/\s,@]*)?@)?([A-Za-z0-9_.-]+)")


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
        texts = strings(svc.get("environment")) + strings(svc.get("command"))
        for text in texts:
            for scheme, _, host in URL.findall(text):
                if host in names and scheme not in ("https", "postgresql"):
                    problems.append(f"{name}: {scheme}://{host} is not https")
        for var, value in env.items():
            if var.endswith("ETCD_ENDPOINTS") and any(
                not e.startswith("https://") for e in value.split(",")
            ):
                problems.append(f"{name}: {var} has a plaintext endpoint")
        uses_ca = any(CA in t for t in texts + strings(svc.get("healthcheck")))
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
