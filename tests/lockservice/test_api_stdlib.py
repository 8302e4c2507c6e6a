"""NFR-16: the lock contract module imports nothing outside the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import lockservice.api

_STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def third_party_imports(source: str) -> set[str]:
    """Top-level names of every module imported by `source` that is not in the standard library."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import reaches into the project itself
                found.add("." * node.level + (node.module or ""))
            elif node.module:
                found.add(node.module.split(".")[0])
    return found - _STDLIB


def test_api_imports_only_the_standard_library() -> None:
    """lockservice/api.py imports only standard-library modules."""
    source = Path(lockservice.api.__file__).read_text()
    assert third_party_imports(source) == set()


def test_checker_flags_a_third_party_import() -> None:
    """Negative control: the checker reports third-party, project and relative imports."""
    source = "import re\nimport structlog\nfrom pydantic import BaseModel\nfrom . import x\n"
    assert third_party_imports(source) == {"structlog", "pydantic", "."}
    assert third_party_imports("from lockservice.server.backends import events") == {"lockservice"}
