"""Package entry points export their public names and import nothing heavy (common.lazy).

The workflow sandbox passes `ledger.states` through, which runs `ledger/__init__` first: it must
not load the store, asyncpg or Prometheus counters. Each probe runs in a fresh interpreter, and
the last one is the negative control: touching `ledger.PayoutStore` does load them.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAZY_PACKAGES = [
    "ledger",
    "railproxy",
    "railstub",
    "finledger",
    "lockservice.server",
    "lockservice.sdk",
    "lockservice.verifiers",
]
HEAVY = ("asyncpg", "prometheus_client", "fastapi", "uvicorn", "httpx")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nimport json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return list(json.loads(out))


def _type_checking_names(package: str) -> dict[str, str]:
    tree = ast.parse(ROOT.joinpath(*package.split("."), "__init__.py").read_text())
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                names.update({alias.name: imp.module for alias in imp.names})
    return names


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_exports_table_all_and_type_names_agree(package: str) -> None:
    pkg = importlib.import_module(package)
    exports: dict[str, str] = pkg._EXPORTS
    assert sorted(pkg.__all__) == sorted(exports)
    assert _type_checking_names(package) == exports
    for name, module in exports.items():
        assert getattr(pkg, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError):
        _ = pkg.no_such_name


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_importing_a_package_loads_none_of_its_modules(package: str) -> None:
    loaded = _loaded_after(f"import {package}")
    assert [m for m in loaded if m.startswith(f"{package}.")] == []
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_the_workflow_sandbox_pass_through_is_side_effect_free() -> None:
    loaded = _loaded_after("import ledger.states")
    assert [m for m in loaded if m.startswith("ledger.")] == ["ledger.errors", "ledger.states"]
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []


def test_negative_control_touching_the_store_loads_it() -> None:
    loaded = _loaded_after("import ledger; ledger.PayoutStore")
    assert "ledger.store" in loaded
    assert "asyncpg" in loaded
