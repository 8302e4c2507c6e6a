"""Shared loaders of the deployment files (tests/deploy) and the static tools run on them
(checkov, the HCL2 parse options): static checks only, no engine runs."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import yaml
from hcl2.utils import SerializationOptions

from common.tls import client_context

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
TERRAFORM = ROOT / "terraform"
CHECKOV = ROOT / ".venv" / "checkov" / "bin" / "checkov"

#: python-hcl2 8 (constraints.txt) keeps a string's quotes and marks blocks unless told not to;
#: with these options a string is plain ('REGIONAL'), an attribute is its value, a nested block
#: is a list of dicts, and `depends_on` is a flat list of "${address}" strings.
HCL_OPTIONS = SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True
)


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def k8s_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def pod_template(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec", {})
    if "template" in spec:
        return spec["template"]  # type: ignore[no-any-return]
    job = spec.get("jobTemplate", {}).get("spec", {})
    return job.get("template")  # type: ignore[no-any-return]


def workloads() -> dict[str, dict[str, Any]]:
    """Every Kubernetes object with a pod template, by name."""
    return {d["metadata"]["name"]: d for d in k8s_documents() if pod_template(d)}


def main_container(doc: dict[str, Any]) -> dict[str, Any]:
    template = pod_template(doc)
    assert template is not None
    return template["spec"]["containers"][0]  # type: ignore[no-any-return]


def checkov(framework: str, target: Path) -> dict[str, Any]:
    assert CHECKOV.exists(), "checkov is not installed: make deploy-lint (make test builds it)"
    flag = "-f" if target.is_file() else "-d"
    proc = subprocess.run(
        [
            str(CHECKOV),
            flag,
            str(target),
            "--framework",
            framework,
            "--skip-download",
            "--quiet",
            "--compact",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    out = json.loads(proc.stdout)
    report = out[0] if isinstance(out, list) else out
    assert isinstance(report, dict) and "summary" in report, proc.stdout[:500]
    return report


def failed(report: dict[str, Any]) -> list[str]:
    return [f"{f['check_id']} {f['resource']}" for f in report["results"]["failed_checks"]]


def scrape(port: int, path: str, ca: Path, server_name: str) -> bytes:
    """GET `path` from 127.0.0.1:`port` as Prometheus does with `tls_config.server_name` (its
    dns_sd and pod-discovery jobs): by address, the certificate checked against `ca` for
    `server_name`. The raw HTTP/1.0 answer."""
    context = client_context(str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(f"GET {path} HTTP/1.0\r\nHost: {server_name}\r\n\r\n".encode())
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
