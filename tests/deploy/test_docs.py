"""The README's configuration table covers every variable the deployments set, and links the
deployment docs (issue 18, "Done when")."""

from __future__ import annotations

import fnmatch
import re

from tests.deploy import envcontract
from tests.deploy.conftest import ROOT, compose, main_container, workloads


def documented() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_*]+)`", line.split("|")[1]))
    return names


def covered(name: str, table: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in table)


def deployed_variables() -> set[str]:
    names: set[str] = set()
    for component in envcontract.COMPONENTS:
        names |= set(compose()["services"][component.name].get("environment") or {})
        names |= {e["name"] for e in main_container(workloads()[component.name]).get("env", [])}
    interpolated = re.findall(r"\$\{([A-Z_]+)", (ROOT / "docker-compose.yml").read_text())
    return names | set(interpolated)


def test_readme_configuration_covers_every_deployed_variable() -> None:
    table = documented()
    missing = sorted(n for n in deployed_variables() if not covered(n, table))
    assert missing == []


def test_negative_control_an_undocumented_variable_is_found() -> None:
    assert not covered("LOCK_SOMETHING_NEW", documented())
    assert covered("RAILPROXY_RAIL_URL", documented())  # through `RAILPROXY_*`


def test_readme_links_the_deployment_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in ("docs/deploy-compose.md", "docs/deploy-gcp.md"):
        assert f"]({doc})" in readme and (ROOT / doc).exists()
