"""Shared loaders of the deployment files (tests/deploy): static checks only, no engine runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
TERRAFORM = ROOT / "terraform"
CHECKOV = ROOT / ".venv" / "checkov" / "bin" / "checkov"


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
