"""TLS in deploy/k8s, terraform/ and the cluster's Prometheus configuration (issue 27 §1;
docs/deploy-gcp.md, "TLS"), statically: every server serves its certificate from its own
read-only Secret and is probed over HTTPS; every client has the CA and https:// URLs; no plain
http:// between components; etcd is mutual TLS for clients and peers; every Temporal client has
TEMPORAL_TLS_*; every DSN reaches Cloud SQL through its pod's Auth Proxy, which the instance
enforces; every Secret and ConfigMap mounted for TLS is created by a documented command. Each
check has a negative control: a mutated copy of the manifests that it must reject."""

from __future__ import annotations

import copy
import re
import runpy
from collections.abc import Iterator
from typing import Any

import hcl2
import yaml

from common.db_roles import DSN_VARS
from tests.deploy import envcontract
from tests.deploy.conftest import (
    HCL_OPTIONS,
    ROOT,
    TERRAFORM,
    k8s_documents,
    main_container,
    pod_template,
)

CERTS = runpy.run_path(str(ROOT / "deploy" / "k8s_tls.py"))["CERTS"]
CA_CONFIGMAP = "payouts-ca"
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

Docs = list[dict[str, Any]]


def by_name(docs: Docs) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if pod_template(d)}


def spec(doc: dict[str, Any]) -> dict[str, Any]:
    template = pod_template(doc)
    assert template is not None
    return template["spec"]  # type: ignore[no-any-return]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec(doc).get("initContainers", []), *spec(doc)["containers"]]


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def source_of(doc: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The volume a file path of `container` lies on, if it is mounted read-only."""
    volumes = {v["name"]: v for v in spec(doc).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/") and mount.get("readOnly"):
            return volumes.get(mount["name"])
    return None


def on_secret(doc: dict[str, Any], container: dict[str, Any], path: str, secret: str) -> bool:
    """`path` is on a read-only mount of Secret `secret`, files mode 0400 (with the pod's fsGroup
    the kubelet adds group read: 0440, root:10001, the pod's own group)."""
    volume = source_of(doc, container, path) or {}
    s = volume.get("secret") or {}
    return s.get("secretName") == secret and s.get("defaultMode") == 0o400


def on_ca(doc: dict[str, Any], container: dict[str, Any], path: str) -> bool:
    volume = source_of(doc, container, path) or {}
    return (volume.get("configMap") or {}).get("name") == CA_CONFIGMAP and path.endswith("/ca.crt")


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
    flags = dict(a.split("=", 1) if "=" in a else (a, "true") for a in args if a.startswith("--"))
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


# --- where the Secrets come from ------------------------------------------------------------


def mounted_tls_objects(docs: Docs) -> tuple[set[str], set[str]]:
    """(Secrets, ConfigMaps) mounted by any pod, less the ones that are not TLS material."""
    secrets, config_maps = set(), set()
    for doc in by_name(docs).values():
        for v in spec(doc).get("volumes", []):
            if "secret" in v:
                secrets.add(v["secret"]["secretName"])
            if "configMap" in v:
                config_maps.add(v["configMap"]["name"])
    return secrets, config_maps - {"payouts-config", "otel-collector"}


def documented_commands() -> str:
    doc = (ROOT / "docs" / "deploy-gcp.md").read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", doc, re.M | re.S)
    return "\n".join(blocks)


def created_by_docs(commands: str) -> tuple[set[str], set[str]]:
    """Secrets and ConfigMaps the documented kubectl commands create (a `for s in ...` loop over
    `create secret tls $s-tls` counts each name)."""
    secrets = set(
        re.findall(r"kubectl -n payouts create secret (?:tls|generic) ([a-z0-9-]+)", commands)
    )
    for names, body in re.findall(
        r"for s in ([a-z0-9 -]+); do\s*\\?\s*\n?\s*(kubectl[^\n]*)", commands
    ):
        if "create secret tls $s-tls" in body:
            secrets |= {f"{n}-tls" for n in names.split()}
    config_maps = set(re.findall(r"kubectl -n payouts create configmap ([a-z0-9-]+)", commands))
    return secrets, config_maps


def test_every_mounted_secret_is_created_by_a_documented_command() -> None:
    secrets, config_maps = mounted_tls_objects(k8s_documents())
    assert secrets == {leaf.secret for leaf in CERTS.values()}
    assert config_maps == {CA_CONFIGMAP}
    made_secrets, made_config_maps = created_by_docs(documented_commands())
    assert secrets <= made_secrets and config_maps <= made_config_maps
    # Negative controls: a command that creates fewer is caught.
    fewer = documented_commands().replace(" finledger ", " ")
    assert "finledger-tls" not in created_by_docs(fewer)[0]
    fewer = documented_commands().replace(" worker outbox ", " ")
    assert {"worker-tls", "outbox-tls"}.isdisjoint(created_by_docs(fewer)[0])


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
