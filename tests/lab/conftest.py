"""Fixtures of the lab tests: a private, world-traversable run directory per chaos run, and the
stack tests' private ports and run folders for the game day.

The chaos runner starts its own stack on free ports (lab.experiments.isolated_ports), so it
never collides with a developer's `payouts up` or another test's stack.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.stack.conftest import stack_dir, stack_env

__all__ = ["chaos_dir", "stack_dir", "stack_env"]


@pytest.fixture
def chaos_dir(run_dir: Path) -> Path:
    """A run directory the embedded PostgreSQL (run as an unprivileged user) can reach."""
    path = run_dir / f"chaos-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    return path
