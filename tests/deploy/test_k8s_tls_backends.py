"""etcd in deploy/k8s is mutual TLS for clients and peers, every Temporal client speaks TLS with
its client certificate, and every DSN reaches Cloud SQL through its pod's Auth Proxy, which the
instance in terraform/ enforces (issue 27 §1; docs/deploy-gcp.md, "TLS"), statically, each check
with a negative control: a mutated copy that it must reject."""

from __future__ import annotations

import copy
import re
from typing import Any

import hcl2

from common.db_roles import DSN_VARS
from tests.deploy import envcontract
from tests.deploy.conftest import HCL_OPTIONS, TERRAFORM, k8s_documents, main_container
from tests.deploy.k8s_tls_mounts import (
    CERTS,
    Docs,
    by_name,
    containers,
    env,
    on_ca,
    on_secret,
    source_of,
    spec,
)

# --- etcd ------------------------------------------------------------------------------------

ETCD_FLAGS = ("--client-cert-auth", "--peer-client-cert-auth")
ETCD_FILES = {
    "--trusted-ca-file": "ca",
    "--peer-trusted-ca-file": "ca",
    "--cert-file": "tls.crt",
    "--key-file": "tls.key",
    "--peer-cert-file": "tls.crt",
    "--peer-key-file": "tls.key",
}
ETCD_URLS = (
    "--listen-client-urls",
    "--advertise-client-urls",
    "--listen-peer-urls",
    "--initial-advertise-peer-urls",
    "--initial-cluster",
)


def etcd_problems(docs: Docs) -> list[str]:
    doc = by_name(docs)["etcd"]
    c = main_container(doc)
    args = [str(a) for a in c["command"]]
    split = (a.partition("=") for a in args if a.startswith("--"))
    flags = {name: value if eq else "true" for name, eq, value in split}
    problems = [f"etcd: {f} missing" for f in ETCD_FLAGS if flags.get(f) != "true"]
    for flag, kind in ETCD_FILES.items():
        path = flags.get(flag, "")
        ok = (
            on_ca(doc, c, path)
            if kind == "ca"
            else (path.endswith(kind) and on_secret(doc, c, path, CERTS["etcd"].secret))
        )
        if not ok:
            problems.append(f"etcd: {flag}={path or '(unset)'} is not on its Secret or the CA")
    for flag in ETCD_URLS:
        urls = re.findall(r"(\w+)://", flags.get(flag, ""))
        if not urls or set(urls) != {"https"}:
            problems.append(f"etcd: {flag} is not https only")
    metrics_port = flags.get("--listen-metrics-urls", "").rsplit(":", 1)[-1]
    for probe in ("readinessProbe", "livenessProbe"):
        if str(c[probe]["httpGet"]["port"]) != metrics_port:
            problems.append(f"etcd: {probe} is not on the metrics listener (no client certificate)")
    return problems


def test_etcd_is_mutual_tls_for_clients_and_peers() -> None:
    docs = k8s_documents()
    assert etcd_problems(docs) == []
    bad = copy.deepcopy(docs)
    c = main_container(by_name(bad)["etcd"])
    c["command"] = [
        a.replace("--listen-peer-urls=https", "--listen-peer-urls=http")
        for a in c["command"]
        if a not in ("--client-cert-auth", "--peer-trusted-ca-file=/var/run/payouts-ca/ca.crt")
    ]
    c["livenessProbe"]["httpGet"]["port"] = 2379
    assert etcd_problems(bad) == [
        "etcd: --client-cert-auth missing",
        "etcd: --peer-trusted-ca-file=(unset) is not on its Secret or the CA",
        "etcd: --listen-peer-urls is not https only",
        "etcd: livenessProbe is not on the metrics listener (no client certificate)",
    ]


# --- Temporal ------------------------------------------------------------------------------

TEMPORAL_FILES = {
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "ca.crt",
    "TEMPORAL_TLS_CLIENT_CERT_PATH": "tls.crt",
    "TEMPORAL_TLS_CLIENT_KEY_PATH": "tls.key",
}


def temporal_problems(docs: Docs) -> list[str]:
    problems: list[str] = []
    for name, doc in by_name(docs).items():
        c = main_container(doc)
        names = {e["name"] for e in c.get("env", [])}
        if not names & {"TEMPORAL_ADDRESS", "WORKER_TEMPORAL_ADDRESS"}:
            continue
        e = env(c)
        if e.get("TEMPORAL_TLS") != "true":
            problems.append(f"{name}: TEMPORAL_TLS is not true")
        for var, suffix in TEMPORAL_FILES.items():
            path = e.get(var, "")
            if not (
                path.endswith(suffix) and on_secret(doc, c, path, CERTS["temporal-client"].secret)
            ):
                problems.append(f"{name}: {var} is not on Secret temporal-client-tls")
    return problems


def test_every_temporal_client_speaks_tls_with_its_client_certificate() -> None:
    docs = k8s_documents()
    assert temporal_problems(docs) == []
    clients = {
        n
        for n, d in by_name(docs).items()
        if {"TEMPORAL_ADDRESS", "WORKER_TEMPORAL_ADDRESS"}
        & {e["name"] for e in main_container(d).get("env", [])}
    }
    # the same set the env contract calls Temporal clients (it reads TEMPORAL_TLS_* there)
    assert clients == {
        c.name for c in envcontract.COMPONENTS if c.extra >= envcontract.TEMPORAL_CLIENT
    }
    assert clients == {"worker", "reconcile-schedule", "invariants"}
    bad = copy.deepcopy(docs)
    c = main_container(by_name(bad)["invariants"])
    c["env"] = [e for e in c["env"] if e["name"] != "TEMPORAL_TLS_CLIENT_KEY_PATH"]
    for e in main_container(by_name(bad)["worker"])["env"]:
        if e["name"] == "TEMPORAL_TLS":
            e["value"] = "false"
    assert temporal_problems(bad) == [
        "worker: TEMPORAL_TLS is not true",
        "invariants: TEMPORAL_TLS_CLIENT_KEY_PATH is not on Secret temporal-client-tls",
    ]


# --- PostgreSQL: Cloud SQL through the Auth Proxy --------------------------------------------

PROXY_DSN = re.compile(r"^postgresql://[^@/]+@127\.0\.0\.1:5432/payouts\?sslmode=disable$")


def has_proxy(doc: dict[str, Any]) -> bool:
    """The pod runs the Cloud SQL Auth Proxy as a native sidecar on 127.0.0.1:5432, private IP,
    IAM login: it is the TLS 1.3 end of the connection, the database pod's loopback the other."""
    for c in spec(doc).get("initContainers", []):
        if "cloud-sql-proxy" in c["image"] and c.get("restartPolicy") == "Always":
            args = set(c.get("args", []))
            return {"--private-ip", "--auto-iam-authn", "--port=5432"} <= args
    return False


def dsn_problems(docs: Docs) -> list[str]:
    """A DSN is either the pod's own Auth Proxy on loopback (sslmode=disable: the proxy encrypts)
    or verified TLS to the server (sslmode=verify-full with a mounted sslrootcert)."""
    problems: list[str] = []
    for name, doc in by_name(docs).items():
        for c in containers(doc):
            for var, value in env(c).items():
                if var not in DSN_VARS and var != "DATABASE_URL":
                    continue
                if PROXY_DSN.match(value):
                    if not has_proxy(doc):
                        problems.append(f"{name}: {var} is loopback without the Auth Proxy sidecar")
                    continue
                query = dict(
                    p.split("=", 1) for p in value.partition("?")[2].split("&") if "=" in p
                )
                root = query.get("sslrootcert", "")
                if query.get("sslmode") != "verify-full" or source_of(doc, c, root) is None:
                    problems.append(f"{name}: {var} is neither the Auth Proxy nor verify-full")
    return problems


def test_every_dsn_reaches_cloud_sql_through_its_pods_auth_proxy() -> None:
    docs = k8s_documents()
    assert dsn_problems(docs) == []
    dsns = [
        v
        for d in by_name(docs).values()
        for c in containers(d)
        for k, v in env(c).items()
        if k in DSN_VARS
    ]
    assert len(dsns) >= 6
    bad = copy.deepcopy(docs)
    w = by_name(bad)
    for e in main_container(w["outbox"])["env"]:
        if e["name"] == "OUTBOX_DATABASE_URL":
            e["value"] = "postgresql://payouts_outbox@10.20.0.3:5432/payouts?sslmode=require"
    spec(w["railproxy"])["initContainers"] = [
        c for c in spec(w["railproxy"])["initContainers"] if c["name"] != "cloud-sql-proxy"
    ]
    assert dsn_problems(bad) == [
        "railproxy: RAILPROXY_DATABASE_URL is loopback without the Auth Proxy sidecar",
        "outbox: OUTBOX_DATABASE_URL is neither the Auth Proxy nor verify-full",
    ]


def sql_tls_problems(instance: dict[str, Any]) -> list[str]:
    settings = instance["settings"][0]
    ip = settings["ip_configuration"][0]
    problems = []
    if settings.get("connector_enforcement") != "REQUIRED":
        problems.append("connector_enforcement is not REQUIRED")
    if ip.get("ssl_mode") not in ("ENCRYPTED_ONLY", "TRUSTED_CLIENT_CERTIFICATE_REQUIRED"):
        problems.append("ssl_mode allows unencrypted connections")
    if ip.get("ipv4_enabled") is not False:
        problems.append("the instance has a public IP")
    return problems


def test_cloud_sql_refuses_anything_but_the_auth_proxy_and_tls() -> None:
    with (TERRAFORM / "sql.tf").open() as f:
        parsed = hcl2.load(f, serialization_options=HCL_OPTIONS)
    instance = parsed["resource"][0]["google_sql_database_instance"]["paydb"]
    assert sql_tls_problems(instance) == []
    assert (
        instance["settings"][0]["ip_configuration"][0]["ssl_mode"]
        == "TRUSTED_CLIENT_CERTIFICATE_REQUIRED"
    )
    bad = copy.deepcopy(instance)
    del bad["settings"][0]["connector_enforcement"]
    bad["settings"][0]["ip_configuration"][0]["ssl_mode"] = "ALLOW_UNENCRYPTED_AND_ENCRYPTED"
    assert sql_tls_problems(bad) == [
        "connector_enforcement is not REQUIRED",
        "ssl_mode allows unencrypted connections",
    ]
