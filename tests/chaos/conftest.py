"""Fixtures of the chaos tests: a private, world-traversable run directory per run.

The chaos runner starts its own stack on free ports (lab.experiments.isolated_ports), so it
never collides with a developer's `payouts up` or another test's stack.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest


@pytest.fixture
def chaos_dir(run_dir: Path) -> Path:
    """A run directory the embedded PostgreSQL (run as an unprivileged user) can reach."""
    path = run_dir / f"chaos-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    return path
