"""Lazy package exports: a package's `__init__` names its public API without importing it.

Why: importing one light module of a package (e.g. `ledger.states` into the workflow sandbox)
runs the package's `__init__` first; were that to import the store, it would load asyncpg and
register Prometheus counters as a side effect. With `lazy_exports`, `__init__` imports nothing,
and `from ledger import PayoutStore` still works: the module that defines a name is imported on
first access (PEP 562). Type checkers see the names through an `if TYPE_CHECKING:` import block
beside the table; tests/test_lazy_exports.py holds the two equal.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` resolving each name of `exports` (name -> module)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
