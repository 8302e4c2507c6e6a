"""Deployment cannot drift from the code: every component of docs/architecture.md (section
"Processes and the real components they use") is deployed by docker-compose.yml and deploy/k8s
with the command the image runs, and with the environment variables its code reads
(tests/deploy/envcontract.py derives them from the settings classes)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings, SettingsConfigDict

from tests.deploy import envcontract
from tests.deploy.conftest import ROOT, compose, main_container, workloads

DEFAULTS_PATH = ROOT / "deploy" / "env-defaults.yaml"


def kept_defaults() -> dict[str, set[str]]:
    data = yaml.safe_load(DEFAULTS_PATH.read_text())
    return {name: set(names or ()) for name, names in data.items()}


def compose_env(service: dict[str, Any]) -> set[str]:
    return set(service.get("environment") or {})


def k8s_env(doc: dict[str, Any]) -> set[str]:
    return {e["name"] for e in main_container(doc).get("env", [])}


def drift(component: envcontract.Component, deployed: set[str], kept: set[str]) -> list[str]:
    """What is wrong between a deployment's variables and what the code reads."""
    reads = envcontract.variables(component)
    problems = [
        f"{component.name}: sets {n}, which its code does not read"
        for n in sorted(deployed - reads - envcontract.IMAGE_VARIABLES)
    ]
    problems += [
        f"{component.name}: {n} is read by the code but neither set nor listed in "
        "deploy/env-defaults.yaml"
        for n in sorted(reads - deployed - kept)
    ]
    return problems


ARCHITECTURE_COMPOSE = {"temporal", "postgres", "etcd-0", "etcd-1", "etcd-2", "lock-server"}
ARCHITECTURE_K8S = {"etcd", "lock-server", "railstub", "railproxy", "worker"}


def test_every_component_is_deployed_with_its_command() -> None:
    services = compose()["services"]
    k8s = workloads()
    assert set(services) >= ARCHITECTURE_COMPOSE
    assert set(k8s) >= ARCHITECTURE_K8S
    assert services["worker"]["deploy"]["replicas"] > 1
    for component in envcontract.COMPONENTS:
        assert services[component.name]["command"] == list(component.command), component.name
        assert main_container(k8s[component.name])["command"] == list(component.command)


@pytest.mark.parametrize("component", envcontract.COMPONENTS, ids=lambda c: c.name)
def test_compose_and_manifests_set_what_the_code_reads(component: envcontract.Component) -> None:
    kept = kept_defaults()[component.name]
    assert drift(component, compose_env(compose()["services"][component.name]), kept) == []
    assert drift(component, k8s_env(workloads()[component.name]), kept) == []


def test_kept_defaults_name_only_variables_the_code_reads() -> None:
    kept = kept_defaults()
    assert set(kept) == {c.name for c in envcontract.COMPONENTS}
    for component in envcontract.COMPONENTS:
        stale = kept[component.name] - envcontract.variables(component)
        assert stale == set(), f"{component.name}: deploy/env-defaults.yaml lists {stale}"


class _NewSetting(BaseSettings):
    """Stands in for a settings class after another change added a credential to it."""

    model_config = SettingsConfigDict(env_prefix="LOCK_")
    backend: str = "postgres"
    auth_token_path: str | None = None


def test_negative_control_a_variable_new_in_the_code_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A settings field the deployments do not know is reported by name, and a variable the code
    does not read (a typo) is reported too: the check is not vacuous."""
    monkeypatch.setattr(envcontract, "_NewSetting", _NewSetting, raising=False)
    component = envcontract.Component(
        "lock-server", ("x",), settings=("tests.deploy.envcontract:_NewSetting",)
    )
    problems = drift(component, {"LOCK_BACKEND", "LOCK_BAKEND"}, set())
    assert problems == [
        "lock-server: sets LOCK_BAKEND, which its code does not read",
        "lock-server: LOCK_AUTH_TOKEN_PATH is read by the code but neither set nor listed in "
        "deploy/env-defaults.yaml",
    ]


def test_literal_environment_reads_are_found() -> None:
    assert {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"} <= envcontract.literal_environment_reads(
        "payouts.reconcile_cli"
    )
    # `payouts db migrate`: the admin DSN and the role passwords' folder (docs/database-roles.md)
    assert {"DATABASE_URL", "DB_ROLE_PASSWORDS_DIR"} <= envcontract.literal_environment_reads(
        "payouts.cli"
    )
    # a command's own role DSN, then the shared fallback: found through the DSN look-up
    assert {"OUTBOX_DATABASE_URL", "DATABASE_URL"} <= envcontract.literal_environment_reads(
        "payouts.outbox_cli"
    )
    assert "CHECKER_DATABASE_URL" in envcontract.literal_environment_reads("payouts.invariants_cli")
    assert "RECONCILE_DATABASE_URL" in envcontract.literal_environment_reads(
        "payouts.reconcile_cli"
    )


def test_image_copies_every_package_the_project_installs() -> None:
    """A package added to pyproject (e.g. split out of another) must reach the image."""
    import re
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.removesuffix("*") for p in include}
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", dockerfile, re.M))
    allowed = set(re.findall(r"^!(\w+)/$", (ROOT / ".dockerignore").read_text(), re.M))
    assert copied == packages and allowed == packages
    for module in pyproject["tool"]["setuptools"]["py-modules"]:
        assert f"{module}.py" in dockerfile


def test_compose_registers_every_search_attribute_the_workflow_upserts() -> None:
    from workflows.search_attributes import SEARCH_ATTRIBUTE_TYPES

    command = compose()["services"]["temporal-setup"]["command"]
    pairs = dict(
        zip(
            [c.removeprefix("--name=") for c in command if c.startswith("--name=")],
            [c.removeprefix("--type=") for c in command if c.startswith("--type=")],
            strict=True,
        )
    )
    assert pairs == SEARCH_ATTRIBUTE_TYPES
