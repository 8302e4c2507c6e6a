"""The ops tests start real stacks: they share the stack tests' private ports and run folders."""

from tests.stack.conftest import stack_dir, stack_env

__all__ = ["stack_dir", "stack_env"]
