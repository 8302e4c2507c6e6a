"""The deployments' bearer credentials (common.credentials): deploy/gen_env.py generates a token per
identity and a credentials file per server, for the same identities and servers as the local
stack; docker-compose.yml's `credentials` job installs each component's own files (the real
script, run here) into that component's volume, mode 0400; each compose service and Kubernetes
workload mounts only its own, and may read only its own Secret Manager secrets (terraform/iam.tf).
Each check has a negative control: a component given another's secret is reported, and a
credentials file readable by others is refused."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import stat
import subprocess
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import hcl2
import pytest
import yaml

from common.credentials import Credentials, CredentialsError, read_token
from common.db_roles import ROLE_NAMES
from stack.credentials import STACK_ACCEPTS, STACK_IDENTITIES
from tests.deploy import envcontract
from tests.deploy.conftest import (
    HCL_OPTIONS,
    K8S,
    ROOT,
    TERRAFORM,
    compose,
    main_container,
    pod_template,
    workloads,
)

SCRIPT = ROOT / "deploy" / "compose" / "install-credentials.sh"
MOUNT = PurePosixPath("/run/credentials")
#: The variables that name a credentials or token file (README, "Configuration").
CREDENTIAL_VAR = re.compile(r"_(CREDENTIALS_PATH|TOKEN_FILE)$")


def gen_env() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_env", ROOT / "deploy" / "gen_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    credentials = tmp_path_factory.mktemp("secrets") / "credentials"
    gen_env().write_role_passwords(credentials / "db-roles")
    return gen_env().write_credentials_files(credentials)  # type: ignore[no-any-return]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def credential_env(env: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in env.items() if CREDENTIAL_VAR.search(k)}


# --- generation -------------------------------------------------------------------------------


def test_gen_env_writes_private_tokens_and_each_servers_credentials(generated: Path) -> None:
    tokens = {name: generated / "tokens" / f"{name}.token" for name in STACK_IDENTITIES}
    assert mode(generated) == mode(generated / "tokens") == 0o700
    assert all(mode(p) == 0o600 for p in [*tokens.values(), *generated.glob("*.json")])
    for server, accepted in STACK_ACCEPTS.items():
        creds = Credentials.load(generated / f"{server}.json")
        for name, path in tokens.items():
            ident = creds.authenticate(read_token(token_file=path))
            # Negative control in the same loop: every identity the server does not list is
            # refused (the outbox's token is no good at the lock server, and so on).
            assert (ident is not None and ident.name == name) == (name in accepted), (server, name)
    before = {p: p.read_text() for p in tokens.values()}
    gen_env().write_credentials_files(generated)
    assert {p: p.read_text() for p in tokens.values()} == before, "a second run replaced a token"


# --- docker-compose.yml -----------------------------------------------------------------------


def installed_by_script() -> dict[str, dict[str, str]]:
    """component -> {file name in its volume: source under deploy/secrets/credentials/}."""
    out: dict[str, dict[str, str]] = {}
    for comp, source, name in re.findall(r"^put (\S+) (\S+) (\S+)$", SCRIPT.read_text(), re.M):
        out.setdefault(comp, {})[name] = source
    return out


def compose_problems(services: dict[str, Any]) -> list[str]:
    """Each service mounts at most its own credentials volume, read-only, and every credential
    variable it sets names a file the credentials job installs into that volume."""
    installed = installed_by_script()
    problems: list[str] = []
    for name, svc in services.items():
        mounts = [str(v) for v in svc.get("volumes") or [] if str(v).startswith("credentials-")]
        wanted = credential_env(svc.get("environment") or {})
        if name == "credentials":
            continue
        if not wanted and not mounts:
            continue
        if mounts != [f"credentials-{name}:{MOUNT}:ro"]:
            problems.append(f"{name}: mounts {mounts}, not only its own volume read-only")
        for var, value in sorted(wanted.items()):
            path = PurePosixPath(value)
            if path.parent != MOUNT or path.name not in installed.get(name, {}):
                problems.append(f"{name}: {var}={value} is not installed into its own volume")
    return problems


def test_compose_gives_each_component_only_its_own_credentials() -> None:
    services = compose()["services"]
    assert compose_problems(services) == []
    job = services["credentials"]
    assert job["restart"] == "no" and all(
        services[n]["depends_on"]["credentials"] == {"condition": "service_completed_successfully"}
        for n in installed_by_script()
    )
    assert "./deploy/secrets/credentials:/src:ro" in job["volumes"]
    # Every component that reads a credential gets one (the drift test checks each is set).
    for component in envcontract.COMPONENTS:
        reads = {v for v in envcontract.variables(component) if CREDENTIAL_VAR.search(v)}
        kept = set(
            yaml.safe_load((ROOT / "deploy" / "env-defaults.yaml").read_text())[component.name]
            or ()
        )
        assert reads - kept <= set(
            credential_env(services[component.name].get("environment") or {})
        )
    # Negative controls: another component's volume, or a token path outside its own volume.
    bad = copy.deepcopy(services)
    bad["railproxy"]["volumes"].append(f"credentials-worker:{MOUNT}:ro")
    assert compose_problems(bad) == [
        "railproxy: mounts ['credentials-railproxy:/run/credentials:ro', "
        "'credentials-worker:/run/credentials:ro'], not only its own volume read-only"
    ]
    bad = copy.deepcopy(services)
    bad["outbox"]["environment"]["OUTBOX_TOKEN_FILE"] = f"{MOUNT}/worker.token"
    assert compose_problems(bad) == [
        "outbox: OUTBOX_TOKEN_FILE=/run/credentials/worker.token is not installed into its own "
        "volume"
    ]


def test_only_the_migrate_job_gets_every_database_roles_password() -> None:
    """The script installs one password file per role of common/db_roles.py, into the migrate
    job's volume only (it runs `payouts db migrate` with DB_ROLE_PASSWORDS_DIR there)."""
    installed = installed_by_script()
    assert installed["migrate"] == {r: f"db-roles/{r}" for r in ROLE_NAMES}
    others = [c for c, files in installed.items() if c != "migrate"]
    assert not [c for c in others if any(s.startswith("db-roles/") for s in installed[c].values())]
    migrate = compose()["services"]["migrate"]
    assert migrate["environment"]["DB_ROLE_PASSWORDS_DIR"] == str(MOUNT)


def test_credentials_job_installs_readable_0400_files_the_services_accept(
    generated: Path, tmp_path: Path
) -> None:
    """The real script, run as this user (the job runs it as root for uid 10001)."""
    dst = tmp_path / "dst"
    uid = str(os.getuid())
    subprocess.run(["sh", str(SCRIPT), str(generated), str(dst), uid], check=True)
    for component, files in installed_by_script().items():
        assert sorted(p.name for p in (dst / component).iterdir()) == sorted(files), component
        for name, source in files.items():
            path = dst / component / name
            assert mode(path) == 0o400 and path.read_text() == (generated / source).read_text()
            if name == "credentials.json":
                assert Credentials.load(path).identities  # accepted by the server's own check
    # Negative control: the generated file as a bind mount would show it to uid 10001 had it
    # been opened up for reading (0644) is refused by the server, hence the job.
    opened = tmp_path / "opened.json"
    opened.write_text((generated / "lock-server.json").read_text())
    opened.chmod(0o644)
    with pytest.raises(CredentialsError, match="readable by others"):
        Credentials.load(opened)


# --- Kubernetes and Secret Manager ------------------------------------------------------------


def provider_classes() -> dict[str, dict[str, str]]:
    """SecretProviderClass name -> {file path: Secret Manager secret id}."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "SecretProviderClass":
                items = yaml.safe_load(doc["spec"]["parameters"]["secrets"])
                out[doc["metadata"]["name"]] = {
                    i["path"]: i["resourceName"].split("/secrets/")[1].split("/")[0] for i in items
                }
    return out


def iam_secrets() -> dict[str, set[str]]:
    """Kubernetes service account -> the secrets terraform/iam.tf lets it read."""
    with (TERRAFORM / "iam.tf").open() as f:
        parsed = hcl2.load(f, serialization_options=HCL_OPTIONS)
    found: dict[str, set[str]] = {}
    for entry in parsed["locals"][0]["workloads"].values():
        found.setdefault(entry["ksa"], set()).update(entry["secrets"])
    return found


def k8s_credential_env(doc: dict[str, Any]) -> dict[str, str]:
    return credential_env({e["name"]: e.get("value", "") for e in main_container(doc)["env"]})


def k8s_problems(docs: dict[str, dict[str, Any]], classes: dict[str, dict[str, str]]) -> list[str]:
    """Each workload that reads a credential gets it from its own SecretProviderClass, which
    names only secrets its service account may read (terraform/iam.tf)."""
    allowed = iam_secrets()
    problems: list[str] = []
    for name, doc in docs.items():
        template = pod_template(doc)
        assert template is not None
        spec = template["spec"]
        wanted = k8s_credential_env(doc)
        if not wanted:
            continue
        refs = [
            v["csi"]["volumeAttributes"]["secretProviderClass"]
            for v in spec["volumes"]
            if v["name"] == "credentials-source"
        ]
        if refs != [f"credentials-{name}"]:
            problems.append(f"{name}: credentials from {refs}, not its own class")
            continue
        files = classes.get(refs[0], {})
        for secret in sorted(set(files.values()) - allowed.get(spec["serviceAccountName"], set())):
            problems.append(f"{name}: mounts {secret}, which its service account may not read")
        for var, value in sorted(wanted.items()):
            if PurePosixPath(value).parent != MOUNT or PurePosixPath(value).name not in files:
                problems.append(f"{name}: {var}={value} is not a file of its class")
    return problems


def test_k8s_workloads_mount_only_their_own_secrets() -> None:
    docs, classes = workloads(), provider_classes()
    assert k8s_problems(docs, classes) == []
    # The migrate job's role password files are compose's only: on GKE the workloads log in as
    # Cloud SQL IAM users (docs/deploy-gcp.md), so no role has a password there.
    # The operator tool service is compose's command line on its network; on GKE the operator
    # runs the CLI with their own token (docs/deploy-gcp.md).
    compose_only = {"migrate", "operator"}
    assert {n for n in docs if k8s_credential_env(docs[n])} == set(
        installed_by_script()
    ) - compose_only
    # Negative control: the rail proxy's class also hands it the worker's token.
    bad = copy.deepcopy(classes)
    bad["credentials-railproxy"]["worker.token"] = "worker-token"
    assert k8s_problems(docs, bad) == [
        "railproxy: mounts worker-token, which its service account may not read"
    ]
