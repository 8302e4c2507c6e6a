"""deploy/k8s matches the Kubernetes OpenAPI schemas and passes checkov with every skip justified,
its workloads with probes, requests and disruption budgets, each check with a negative control
the same tool refuses."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest

from tests.deploy.conftest import (
    K8S,
    checkov,
    failed,
    k8s_documents,
    main_container,
    pod_template,
    workloads,
)

KUBERNETES_VERSION = "1.33.0"  # GKE's regular channel
#: Custom resources the bundled schemas cannot know; each is checked by hand below.
CUSTOM_KINDS = {"SecretProviderClass"}


# --- Kubernetes -------------------------------------------------------------------------------


def test_manifests_match_the_kubernetes_schemas() -> None:
    docs = k8s_documents()
    custom = [d for d in docs if d["kind"] in CUSTOM_KINDS]
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    for doc in custom:
        assert doc["apiVersion"] == "secrets-store.csi.x-k8s.io/v1"
        assert (
            doc["spec"]["provider"] == "gke"
            and "resourceName" in doc["spec"]["parameters"]["secrets"]
        )
    bad = copy.deepcopy(workloads()["worker"])
    main_container(bad)["imagePullPolicyy"] = "Always"  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_workloads_have_probes_requests_and_disruption_budgets() -> None:
    docs = k8s_documents()
    pdbs = {
        d["spec"]["selector"]["matchLabels"]["app"]: d["spec"]
        for d in docs
        if d["kind"] == "PodDisruptionBudget"
    }
    for name, doc in workloads().items():
        c = main_container(doc)
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], name
        if doc["kind"] in ("Deployment", "StatefulSet"):
            assert "readinessProbe" in c and "livenessProbe" in c, name
            if doc["spec"]["replicas"] > 1:
                assert name in pdbs, f"{name} has no PodDisruptionBudget"
    etcd = workloads()["etcd"]
    assert etcd["spec"]["replicas"] == 3 and pdbs["etcd"] == {
        "minAvailable": 2,
        "selector": {"matchLabels": {"app": "etcd"}},
    }
    anti = pod_template(etcd)["spec"]["affinity"]["podAntiAffinity"]  # type: ignore[index]
    assert (
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
        == "kubernetes.io/hostname"
    )


def test_manifests_pass_checkov_and_every_skip_is_justified(tmp_path: Path) -> None:
    report = checkov("kubernetes", K8S)
    assert failed(report) == [] and report["summary"]["parsing_errors"] == 0
    for doc in k8s_documents():
        for key, value in (doc["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, why = value.partition("=")
                assert re.fullmatch(r"CKV2?_K8S_\d+", check) and len(why) > 20, value
    # Negative control: the worker without its security context is refused.
    worker = copy.deepcopy(workloads()["worker"])
    del main_container(worker)["securityContext"]
    import yaml

    (tmp_path / "w.yaml").write_text(yaml.safe_dump(worker))
    assert "CKV_K8S_20" in {f.split()[0] for f in failed(checkov("kubernetes", tmp_path))}
