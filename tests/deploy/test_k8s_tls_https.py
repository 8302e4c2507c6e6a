"""Our HTTPS servers in deploy/k8s serve their certificates from their own read-only Secrets and
are probed over HTTPS, the span collector receives over TLS only, every client has the CA and
https:// URLs with no plain http:// between components, and the cluster's Prometheus scrapes
them over TLS (issue 27 §1; docs/deploy-gcp.md, "TLS"), statically, each check with a negative
control: a mutated copy of the manifests that it must reject."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import yaml

from common.db_roles import DSN_VARS
from tests.deploy.conftest import ROOT, k8s_documents, main_container
from tests.deploy.k8s_tls_mounts import (
    CA_CONFIGMAP,
    CERTS,
    Docs,
    by_name,
    containers,
    env,
    on_ca,
    on_secret,
    spec,
)

#: Our HTTPS servers: workload -> the prefix of its TLS variables (common.tls.ServerTLS). The
#: workers' /metrics and /health and the outbox publishers' /metrics are served by their pods,
#: probed by the kubelet and scraped by Prometheus, with no Service in front (BEHIND_SERVICE).
SERVERS = {
    "lock-server": "LOCK",
    "railproxy": "RAILPROXY",
    "railstub": "RAILSTUB",
    "finledger": "FINLEDGER",
    "worker": "WORKER",
    "outbox": "OUTBOX",
}
BEHIND_SERVICE = ("lock-server", "railproxy", "railstub", "finledger")
#: The only plain http:// a manifest may carry: etcd's metrics listener (/health, /livez,
#: /metrics), which the kubelet's probes and Prometheus use without a client certificate.
PLAIN_HTTP_ALLOWED = {"--listen-metrics-urls=http://0.0.0.0:2381"}


# --- servers ---------------------------------------------------------------------------------


def server_problems(docs: Docs) -> list[str]:
    problems: list[str] = []
    workloads = by_name(docs)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for name, prefix in SERVERS.items():
        doc = workloads[name]
        c = main_container(doc)
        e = env(c)
        for var, suffix in (
            (f"{prefix}_TLS_CERT_FILE", "tls.crt"),
            (f"{prefix}_TLS_KEY_FILE", "tls.key"),
        ):
            path = e.get(var, "")
            if not (path.endswith("/" + suffix) and on_secret(doc, c, path, CERTS[name].secret)):
                problems.append(
                    f"{name}: {var} is not on its read-only Secret {CERTS[name].secret}"
                )
        if e.get(f"{prefix}_TLS_VERIFY", "true") != "true":
            problems.append(f"{name}: {prefix}_TLS_VERIFY turns verification off")
        for probe in ("readinessProbe", "livenessProbe"):
            if c.get(probe, {}).get("httpGet", {}).get("scheme") != "HTTPS":
                problems.append(f"{name}: {probe} is not HTTPS")
        if any(p.get("name") != "https" for p in c.get("ports", [])):
            problems.append(f"{name}: container port not named https")
        if name in BEHIND_SERVICE:
            ports = [p for p in services[name]["spec"]["ports"]]
            if any(p.get("name") != "https" for p in ports):
                problems.append(f"{name}: Service port not named https")
    return problems


def test_every_server_serves_its_own_secret_and_is_probed_over_https() -> None:
    docs = k8s_documents()
    assert server_problems(docs) == []
    bad = copy.deepcopy(docs)
    w = by_name(bad)
    main_container(w["railstub"])["readinessProbe"]["httpGet"].pop("scheme")
    for v in spec(w["lock-server"])["volumes"]:
        if v["name"] == "tls":
            v["secret"]["secretName"] = "railproxy-tls"  # another server's certificate
    for v in spec(w["finledger"])["volumes"]:
        if v["name"] == "tls":
            v["secret"]["defaultMode"] = 0o444
    # The worker back on plain HTTP: no key, its liveness probe and port plain again.
    worker = main_container(w["worker"])
    worker["env"] = [e for e in worker["env"] if e["name"] != "WORKER_TLS_KEY_FILE"]
    worker["livenessProbe"]["httpGet"].pop("scheme")
    worker["ports"][0]["name"] = "http"
    # The outbox's Secret mounted writable.
    for m in main_container(w["outbox"])["volumeMounts"]:
        if m["name"] == "tls":
            m.pop("readOnly")
    assert server_problems(bad) == [
        "lock-server: LOCK_TLS_CERT_FILE is not on its read-only Secret lock-server-tls",
        "lock-server: LOCK_TLS_KEY_FILE is not on its read-only Secret lock-server-tls",
        "railstub: readinessProbe is not HTTPS",
        "finledger: FINLEDGER_TLS_CERT_FILE is not on its read-only Secret finledger-tls",
        "finledger: FINLEDGER_TLS_KEY_FILE is not on its read-only Secret finledger-tls",
        "worker: WORKER_TLS_KEY_FILE is not on its read-only Secret worker-tls",
        "worker: livenessProbe is not HTTPS",
        "worker: container port not named https",
        "outbox: OUTBOX_TLS_CERT_FILE is not on its read-only Secret outbox-tls",
        "outbox: OUTBOX_TLS_KEY_FILE is not on its read-only Secret outbox-tls",
    ]


def collector_problems(docs: Docs) -> list[str]:
    config_map = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "otel-collector"
    )
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    tls = config["receivers"]["otlp"]["protocols"]["http"].get("tls") or {}
    doc = by_name(docs)["otel-collector"]
    c = main_container(doc)
    problems = [
        f"otel-collector: receiver {key} is not on Secret otel-collector-tls"
        for key in ("cert_file", "key_file")
        if not on_secret(doc, c, str(tls.get(key, "")), CERTS["otel-collector"].secret)
    ]
    return problems


def test_the_collector_receives_spans_over_tls_only() -> None:
    docs = k8s_documents()
    assert collector_problems(docs) == []
    bad = copy.deepcopy(docs)
    cm = next(
        d for d in bad if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "otel-collector"
    )
    config = yaml.safe_load(cm["data"]["config.yaml"])
    del config["receivers"]["otlp"]["protocols"]["http"]["tls"]
    cm["data"]["config.yaml"] = yaml.safe_dump(config)
    assert len(collector_problems(bad)) == 2


# --- clients ---------------------------------------------------------------------------------


def ca_variable(workload: str, var: str) -> str:
    """The variable that names the CA a URL variable's client verifies against."""
    if var.startswith("OTEL_"):
        return "OTEL_EXPORTER_OTLP_CERTIFICATE"
    if var == "LOCK_ETCD_ENDPOINTS":
        return "LOCK_ETCD_CA_FILE"
    if workload == "worker":  # lock server, proxy and (reconcile activity) rail: one client CA
        return "WORKER_TLS_CA_FILE"
    if var.startswith("INVARIANTS_"):  # httpx's default trust store
        return "SSL_CERT_FILE"
    return f"{var.split('_', 1)[0]}_TLS_CA_FILE"


def client_problems(docs: Docs) -> list[str]:
    problems: list[str] = []
    for name, doc in by_name(docs).items():
        for c in containers(doc):
            e = env(c)
            for var, value in e.items():
                if not value.startswith("https://"):
                    continue
                ca = ca_variable(name, var)
                if not on_ca(doc, c, e.get(ca, "")):
                    problems.append(
                        f"{name}: {var} is https but {ca} is not ConfigMap {CA_CONFIGMAP}'s ca.crt"
                    )
            if "LOCK_ETCD_ENDPOINTS" in e:
                for var, suffix in (
                    ("LOCK_ETCD_CERT_FILE", "tls.crt"),
                    ("LOCK_ETCD_KEY_FILE", "tls.key"),
                ):
                    path = e.get(var, "")
                    if not (
                        path.endswith(suffix)
                        and on_secret(doc, c, path, "lock-server-etcd-client-tls")
                    ):
                        problems.append(
                            f"{name}: {var} is not on Secret lock-server-etcd-client-tls"
                        )
    return problems


def walk_strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from walk_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk_strings(value)


def plaintext_problems(docs: Docs) -> list[str]:
    """Any http:// outside PLAIN_HTTP_ALLOWED, and any address variable of ours (`*_URL`,
    `*_ENDPOINT(S)`) that is not https:// (a bare host:port is plaintext too); DSNs are below."""
    problems = [
        f"{d['metadata']['name']}: plain {s!r}"
        for d in docs
        for s in walk_strings(d)
        if "http://" in s and s not in PLAIN_HTTP_ALLOWED
    ]
    for name, doc in by_name(docs).items():
        for c in containers(doc):
            for var, value in env(c).items():
                if var in DSN_VARS or var == "DATABASE_URL":
                    continue
                plain = any(not v.startswith("https://") for v in value.split(","))
                if re.search(r"_(URL|ENDPOINTS?)$", var) and plain:
                    problems.append(f"{name}: {var}={value} is not https://")
    return problems


def test_every_client_has_the_ca_and_nothing_between_components_is_plain_http() -> None:
    docs = k8s_documents()
    assert client_problems(docs) == [] and plaintext_problems(docs) == []
    # Every URL to a server of ours in a container is https (the checks are not vacuous).
    urls = {v for d in by_name(docs).values() for c in containers(d) for v in env(c).values()}
    for server, port in (
        ("lock-server", 8701),
        ("railproxy", 8720),
        ("railstub", 8710),
        ("finledger", 8730),
    ):
        assert f"https://{server}:{port}" in urls
    bad = copy.deepcopy(docs)
    w = by_name(bad)
    for e in main_container(w["outbox"])["env"]:
        if e["name"] == "OUTBOX_FINLEDGER_URL":
            e["value"] = "http://finledger:8730"
    main_container(w["railproxy"])["env"] = [
        e for e in main_container(w["railproxy"])["env"] if e["name"] != "RAILPROXY_TLS_CA_FILE"
    ]
    for e in main_container(w["lock-server"])["env"]:
        if e["name"] == "LOCK_ETCD_ENDPOINTS":
            e["value"] = "etcd-0.etcd:2379"
        if e["name"] == "LOCK_ETCD_KEY_FILE":
            e["value"] = "/tmp/etcd.key"
    assert client_problems(bad) == [
        "lock-server: LOCK_ETCD_KEY_FILE is not on Secret lock-server-etcd-client-tls",
        "railproxy: RAILPROXY_RAIL_URL is https but RAILPROXY_TLS_CA_FILE is not ConfigMap payouts-ca's ca.crt",
    ]
    assert plaintext_problems(bad) == [
        "outbox: plain 'http://finledger:8730'",
        "lock-server: LOCK_ETCD_ENDPOINTS=etcd-0.etcd:2379 is not https://",
        "outbox: OUTBOX_FINLEDGER_URL=http://finledger:8730 is not https://",
    ]


# --- Prometheus -----------------------------------------------------------------------------


def scrape_problems(config: dict[str, Any]) -> list[str]:
    problems = []
    for job in config["scrape_configs"]:
        name = job["job_name"]
        if name in SERVERS:
            tls = job.get("tls_config") or {}
            if job.get("scheme") != "https" or tls.get("server_name") not in CERTS[name].dns:
                problems.append(f"{name}: not scraped over TLS for a name of its certificate")
            if not str(tls.get("ca_file", "")).endswith("/ca.crt"):
                problems.append(f"{name}: no CA file")
        elif job.get("scheme", "http") != "http":
            problems.append(f"{name}: scheme changed; its endpoint is plain HTTP by design")
    return problems


def test_prometheus_scrapes_the_https_servers_and_metrics_endpoints_over_tls() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "kubernetes.yml").read_text())
    assert scrape_problems(config) == []
    plain = {j["job_name"] for j in config["scrape_configs"] if "scheme" not in j}
    # The Temporal SDK's exporter (no TLS in the SDK), etcd's metrics listener, Temporal's own.
    assert plain == {"worker-sdk", "etcd", "temporal"}
    bad = copy.deepcopy(config)
    for job in bad["scrape_configs"]:
        if job["job_name"] == "finledger":
            del job["scheme"]
        if job["job_name"] == "worker":  # another workload's name: the handshake would fail
            job["tls_config"]["server_name"] = "outbox.payouts.svc"
        if job["job_name"] == "outbox":
            del job["tls_config"]
        if job["job_name"] == "worker-sdk":  # https to a plain exporter: every scrape fails
            job["scheme"] = "https"
    assert scrape_problems(bad) == [
        "finledger: not scraped over TLS for a name of its certificate",
        "outbox: not scraped over TLS for a name of its certificate",
        "outbox: no CA file",
        "worker: not scraped over TLS for a name of its certificate",
        "worker-sdk: scheme changed; its endpoint is plain HTTP by design",
    ]
