"""Where a deploy/k8s pod's TLS files come from, for the manifest checks (test_k8s_tls_*.py): the
certificates deploy/k8s_tls.py issues (CERTS), the CA's ConfigMap, a pod's containers and their
literal environment, and whether a path lies on a read-only Secret or on the CA bundle."""

from __future__ import annotations

import runpy
from typing import Any

from tests.deploy.conftest import ROOT, pod_template

CERTS = runpy.run_path(str(ROOT / "deploy" / "k8s_tls.py"))["CERTS"]
CA_CONFIGMAP = "payouts-ca"

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
