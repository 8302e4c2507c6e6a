"""Fixtures of the lab tests: the stack tests' private ports and run folders (tests/stack), for
the chaos runs and the game day, which start real stacks.

The chaos runner starts its own stack on free ports (lab.experiments.harness.isolated_ports), so
it never collides with a developer's `payouts up` or another test's stack.
"""

from tests.stack.conftest import stack_dir, stack_env

__all__ = ["stack_dir", "stack_env"]
