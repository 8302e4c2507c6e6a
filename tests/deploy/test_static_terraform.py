"""terraform/ parses as HCL2, creates the budget before anything billable, keeps secrets out of
state in one region and passes checkov, and each Cloud SQL IAM user joins exactly the
migrations' roles its pod uses, as docs/deploy-gcp.md says, each check with a negative control."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import hcl2

from common.db_roles import DSN_VARS, ROLE_NAMES
from tests.deploy.conftest import (
    HCL_OPTIONS,
    ROOT,
    TERRAFORM,
    checkov,
    failed,
    main_container,
    pod_template,
    workloads,
)

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
