"""No private (underscore) name crosses a module or an object boundary in the product code.

A reader follows a call by reading: `_name` is its module's or its object's own, so another
module never imports it and another object never reaches it. The scan parses every module of the
root packages of pyproject.toml's `[tool.importlinter]` and worker_main.py (never tests/) and
reports:

- an import of an underscore name: `from x import _y`, `from x._y import z`, `import x._y`;
- an attribute `expr._name` (read, written or called), or `getattr(expr, "_name")` and its
  siblings, where `expr` is not `self` or `cls`.

Dunder names (`__future__`, `x.__class__`) are not private. Two kinds of access are allowed: one
inside a class to a name that same class defines (a method, a class-level name, or a
`self._name = ...` in its body: a classmethod constructor setting up the instance it built), and
the few entries of ALLOWED, each with its reason. The negative controls plant each kind of
crossing into parsed source and into a copy of the tree, and the scan must report each.
"""

from __future__ import annotations

import ast
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (module, expression as ast.unparse writes it): why the crossing is accepted.
ALLOWED: dict[tuple[str, str], str] = {
    ("common/exiting.py", "os._exit"): (
        "the standard library's public, documented API: the underscore says it skips cleanup"
    ),
    ("lockservice/server/hotroute.py", "route._embed_body_fields"): (
        "FastAPI's flag for an embedded body has no public name; pyproject.toml pins FastAPI to "
        "the minor release tests/lockservice/test_hotroute.py ran against for this reason"
    ),
}

#: The functions that reach an attribute by its name as a string.
_BY_NAME = {"getattr", "setattr", "hasattr", "delattr"}


@dataclass(frozen=True)
class Crossing:
    """One private name used across a boundary: where, and the code as ast.unparse writes it."""

    path: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}"


def product_modules(root: Path) -> list[Path]:
    """Every module of the root packages of pyproject.toml's import-linter, and worker_main.py."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    packages = config["tool"]["importlinter"]["root_packages"]
    modules = [path for name in packages for path in sorted((root / name).rglob("*.py"))]
    return [*modules, root / "worker_main.py"]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_code(cls: ast.ClassDef) -> list[ast.AST]:
    """Every node of a class's body but those of the classes nested in it (theirs, not its)."""
    nodes: list[ast.AST] = []
    todo: list[ast.AST] = list(cls.body)
    while todo:
        node = todo.pop()
        nodes.append(node)
        if not isinstance(node, ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def defined_by(cls: ast.ClassDef) -> set[str]:
    """The names a class defines: its methods and class-level names, and every attribute its
    own code (not a nested class's) assigns on `self` or `cls`."""
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in _own_code(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in {"self", "cls"}
        ):
            names.add(node.attr)
    return names


class _Scan(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[Crossing] = []
        self.classes: list[set[str]] = []  # what each enclosing class defines, innermost last

    def report(self, node: ast.stmt | ast.expr, code: str) -> None:
        self.found.append(Crossing(self.path, node.lineno, code))

    def own(self, holder: ast.expr, name: str) -> bool:
        """`holder.name` is the code's own: on self or cls, or a name its class defines."""
        if isinstance(holder, ast.Name) and holder.id in {"self", "cls"}:
            return True
        return bool(self.classes) and name in self.classes[-1]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(defined_by(node))
        self.generic_visit(node)
        self.classes.pop()

    def visit_Import(self, node: ast.Import) -> None:
        if any(is_private(part) for alias in node.names for part in alias.name.split(".")):
            self.report(node, ast.unparse(node))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = (node.module or "").split(".")
        if any(is_private(part) for part in module) or any(
            is_private(alias.name) for alias in node.names
        ):
            self.report(node, ast.unparse(node))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr) and not self.own(node.value, node.attr):
            self.report(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if (
            isinstance(func, ast.Name)
            and func.id in _BY_NAME
            and len(args) >= 2
            and isinstance(args[1], ast.Constant)
            and isinstance(args[1].value, str)
            and is_private(args[1].value)
            and not self.own(args[0], args[1].value)
        ):
            self.report(node, ast.unparse(node))
        self.generic_visit(node)


def scan_source(source: str, path: str = "<source>") -> list[Crossing]:
    """Every private name `source` uses across a boundary, ALLOWED ones included."""
    scan = _Scan(path)
    scan.visit(ast.parse(source))
    return scan.found


def scan_tree(root: Path) -> list[Crossing]:
    """Every crossing in the product modules under `root`, less those ALLOWED."""
    found = []
    for module in product_modules(root):
        path = module.relative_to(root).as_posix()
        found += scan_source(module.read_text(), path)
    return [c for c in found if (c.path, c.code) not in ALLOWED]


def test_the_scan_covers_every_product_package() -> None:
    """The scan reads every root package's modules and worker_main.py, and none of tests/."""
    modules = product_modules(ROOT)
    tops = {m.relative_to(ROOT).parts[0] for m in modules}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} - {"tests"}
    assert packages <= tops, f"packages the scan misses: {sorted(packages - tops)}"
    assert "worker_main.py" in tops
    assert "tests" not in tops


def test_no_private_name_crosses_a_boundary() -> None:
    """No product module imports another's underscore name or reaches another object's, but
    for ALLOWED."""
    crossings = scan_tree(ROOT)
    assert not crossings, "private names used across a boundary:\n" + "\n".join(map(str, crossings))


def test_every_allowed_crossing_is_still_there_and_says_why() -> None:
    """Each ALLOWED entry has a reason and still matches code (a stale entry would let a new
    crossing of the same text in through the back door)."""
    found = set()
    for module in product_modules(ROOT):
        path = module.relative_to(ROOT).as_posix()
        found |= {(c.path, c.code) for c in scan_source(module.read_text(), path)}
    assert not set(ALLOWED) - found, f"stale ALLOWED entries: {sorted(set(ALLOWED) - found)}"
    assert all(reason.strip() for reason in ALLOWED.values())


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("from payouts.errors import _deepest_prog", "from payouts.errors import _deepest_prog"),
        ("from stack.embedded._pg import start", "from stack.embedded._pg import start"),
        ("from . import _helpers", "from . import _helpers"),
        ("import stack.embedded._pg", "import stack.embedded._pg"),
        ("await ctx.faults._probe_acquire()", "ctx.faults._probe_acquire"),
        ("log = pg._log", "pg._log"),
        ("standby._run(['pg_ctl', 'promote'])", "standby._run"),
        ("parser._actions.clear()", "parser._actions"),
        ("import argparse\nargparse._SubParsersAction", "argparse._SubParsersAction"),
        ("target._chown = None", "target._chown"),
        ("getattr(pg, '_log', None)", "getattr(pg, '_log', None)"),
        ("setattr(pg, '_log', 1)", "setattr(pg, '_log', 1)"),
        # inside a class, a name the class does not define is still another object's
        (
            "class A:\n    def __init__(self) -> None:\n        self._x = 1\n\n"
            "    def peek(self, other: B) -> int:\n        return other._y\n",
            "other._y",
        ),
        # a class's names are its own, not those of a class nested in it
        (
            "class Outer:\n    class Inner:\n        def __init__(self) -> None:\n"
            "            self._z = 0\n\n"
            "    def f(self, x: Inner) -> None:\n        x._z = 1\n",
            "x._z",
        ),
        # nor those of the class it is nested in
        (
            "class Outer:\n    _z = 0\n\n    class Inner:\n"
            "        def f(self, x: Outer) -> int:\n            return x._z\n",
            "x._z",
        ),
    ],
)
def test_a_planted_crossing_is_reported(source: str, code: str) -> None:
    """Negative control, on parsed source: each kind of crossing is reported, as its code."""
    assert [c.code for c in scan_source(source)] == [code]


@pytest.mark.parametrize(
    "source",
    [
        "self._x = 1\nreturn self._x",
        "cls._registry.clear()",
        "getattr(self, '_words', [])",
        "from __future__ import annotations",
        "x.__class__.__name__",
        # a classmethod constructor setting up the instance it built: the same class's names
        "class B:\n    def __init__(self) -> None:\n        self._c = None\n\n"
        "    @classmethod\n    def make(cls) -> B:\n        b = cls()\n        b._c = 1\n"
        "        b._ready()\n        return b\n\n    def _ready(self) -> None:\n        pass\n",
        # a private class-level field (a dataclass's), read on another instance of the same class
        "class D:\n    _n: int = 0\n\n    def merged(self, o: D) -> int:\n        return o._n\n",
    ],
)
def test_own_names_are_not_reported(source: str) -> None:
    """The scan's exceptions: names on self or cls, dunder names, and inside a class the names
    that same class defines."""
    assert scan_source(source) == []


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "pyproject.toml", tree)
    for module in product_modules(ROOT):
        target = tree / module.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(module, target)
    return tree


@pytest.mark.parametrize(
    ("module", "planted", "code"),
    [
        # another module's private function imported (what a shortcut around a public name does)
        ("payouts/cli.py", "from payouts.errors import _deepest_prog", "_deepest_prog"),
        # another object's private method called (what lab/gameday/scenarios.py did)
        (
            "lab/gameday/scenarios.py",
            "async def _planted(ctx: Ctx) -> None:\n    await ctx.faults._probe_acquire()",
            "ctx.faults._probe_acquire",
        ),
        # another object's private property read (what stack/datastores.py did)
        ("stack/datastores.py", "LOG = EmbeddedPostgres(Path('.'))._log", "._log"),
        # the allowlist is per module: os._exit elsewhere is reported
        ("worker_main.py", "import os\nos._exit(0)", "os._exit"),
    ],
)
def test_a_crossing_planted_in_a_copy_of_the_tree_is_reported(
    tmp_path: Path, module: str, planted: str, code: str
) -> None:
    """Negative control, on a copy of the tree: the one planted crossing is all that is found."""
    tree = _copy(tmp_path)
    target = tree / module
    before = len(target.read_text().splitlines())
    target.write_text(target.read_text() + f"\n{planted}  # planted by the negative control\n")
    crossings = scan_tree(tree)
    assert len(crossings) == 1, crossings
    assert crossings[0].path == module
    assert crossings[0].line > before
    assert code in crossings[0].code
