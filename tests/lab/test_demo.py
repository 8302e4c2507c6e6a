"""Issue 28 §5: the real demo, through the real `payouts` console script on a real stack, prints
its report in words and tables: no dict repr, settled apart from declined."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LAB = [sys.executable, "-m", "lab"]  # `payouts-lab`, what `make demo` runs


@pytest.mark.slow
def test_the_real_demo_report_has_no_dict_repr(stack_env: dict[str, str], stack_dir: Path) -> None:
    """On the embedded PostgreSQL (stack_env unsets DATABASE_URL), as `make demo` runs."""
    env = dict(stack_env)
    args = ["demo", "--payouts", "12", "--accounts", "4", "--workers", "1", "--no-pause"]
    done = subprocess.run(
        [*LAB, *args, "--run-dir", str(stack_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "DEMO PASSED" in out
    assert "{'" not in out and "':" not in out, out
    assert "settled at the rail: money moved once" in out
    assert "declined by the rail: no money moved" in out
    assert "ledger.posted records the finance ledger booked" in out
