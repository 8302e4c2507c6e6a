"""The layering contracts of pyproject.toml hold, and they do catch an upward import.

`make lint` runs `lint-imports` on the tree; here the same contracts run on a copy of the tree
into which one import that breaks each contract is planted (the negative controls), through
the real `lint-imports` command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = [
    p.name
    for p in ROOT.iterdir()
    if (p / "__init__.py").is_file() and p.name not in {"tests"} and not p.name.startswith(".")
]


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the caller reads the return code
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def test_every_root_package_is_in_the_contracts() -> None:
    """A new package left out of root_packages would escape every contract."""
    config = (ROOT / "pyproject.toml").read_text()
    missing = [name for name in PACKAGES if f'"{name}"' not in config]
    assert not missing, f"packages outside [tool.importlinter] root_packages: {missing}"


def test_the_tree_keeps_its_contracts(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # foundation importing a component: upward
        ("common/logs.py", "import ledger.states", "Layers"),
        # a component importing the worker: upward
        ("railproxy/store.py", "import activities.models", "Layers"),
        # a component importing the local stack: upward (what lockservice/bench.py did)
        ("lockservice/server/watermark.py", "import stack.embedded", "Layers"),
        # the top is ordered lab > payouts > stack: the operator's command must not load the lab
        # (what payouts/cli.py's importlib list did), nor the stack the operator's commands
        # (what stack/services.py and stack/system.py did)
        ("payouts/cli.py", "import lab.demo.cli", "Layers"),
        ("stack/services.py", "import payouts.cli", "Layers"),
        ("stack/cli.py", "import lab.stoppable", "Layers"),
        # the worker layer importing the worker process's assembly: upward
        ("activities/reconcile.py", "import worker.settings", "Layers"),
        # the worker process importing the local stack: upward
        ("worker/process.py", "import stack.config", "Layers"),
        # one component reaching into another's internals, not its public client
        ("reconcile/reconciler.py", "import ledger.store", "independent"),
        ("railproxy/service.py", "import lockservice.server.app", "independent"),
        # past the lock service verifiers' public face (lockservice.verifiers) into a module
        ("railproxy/service.py", "import lockservice.verifiers.grants", "independent"),
        # the lock service's SDK or verifiers reaching the server (its app, its signing key)
        ("lockservice/sdk/client.py", "import lockservice.server.app", "never import the server"),
        (
            "lockservice/verifiers/grants.py",
            "import lockservice.server.signing",
            "never import the",
        ),
        # the verifiers importing the SDK (itself free of the server)
        ("lockservice/verifiers/assertions.py", "import lockservice.sdk", "import neither the SDK"),
    ],
)
def test_a_planted_import_breaks_its_contract(
    tmp_path: Path, module: str, planted: str, broken: str
) -> None:
    tree = _copy(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the negative control\n")
    result = _lint(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    assert any(broken in line and "BROKEN" in line for line in result.stdout.splitlines())


CYCLES = """
import json, sys
import grimp
packages = json.loads(sys.argv[1])
graph = grimp.build_graph(*packages, exclude_type_checking_imports=False)
index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10_000)
def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
    for w in graph.find_modules_directly_imported_by(v):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            cycles.append(sorted(comp))
for m in sorted(graph.modules):
    if m not in index:
        visit(m)
print(json.dumps(cycles))
"""


def _cycles(tree: Path) -> list[list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", CYCLES, json.dumps(PACKAGES)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return list(json.loads(out))


def test_no_circle_of_imports(tmp_path: Path) -> None:
    """No cycle of imports anywhere in the tree, counting `if TYPE_CHECKING:` imports too (a
    circle a reader must hold in mind is one even if it never runs); the planted imports below
    are the negative controls, one that runs and one for the type checker only."""
    tree = _copy(tmp_path)
    assert _cycles(tree) == []
    # lab.bench.outbox already imports lab.bench.cpu: the one planted import closes the circle
    target = tree / "lab" / "bench" / "cpu.py"
    target.write_text(
        target.read_text() + "\nimport lab.bench.outbox  # planted: negative control\n"
    )
    assert ["lab.bench.cpu", "lab.bench.outbox"] in _cycles(tree)
    # stack.system imports stack.statefile: annotating the state file with `Stack`, as it once
    # did, closes a circle the type checker alone would follow
    target = tree / "stack" / "statefile.py"
    target.write_text(
        target.read_text()
        + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        + "    from stack.system import Stack  # planted: negative control\n"
    )
    assert ["stack.statefile", "stack.system"] in _cycles(tree)
