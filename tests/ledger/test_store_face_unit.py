"""PayoutStore's public methods are exactly its parts' public methods, with equal signatures.

`PayoutStore` (ledger.store.payout_store) delegates each operation to the part that owns it and
repeats the part's signature: a default changed on one side only would silently win on the
other, which mypy does not see. No database: the classes are only inspected.
"""

from __future__ import annotations

import inspect

import pytest

from ledger.store import PayoutStore
from ledger.store.ambiguity import AmbiguityActions
from ledger.store.commands import OperatorCommands
from ledger.store.reads import Reads
from ledger.store.seeding import Seeding
from ledger.store.steps import WorkerSteps

PARTS = (WorkerSteps, AmbiguityActions, OperatorCommands, Seeding, Reads)


def public_methods(cls: type) -> set[str]:
    return {
        name
        for name, value in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


OWNER = {name: part for part in PARTS for name in public_methods(part)}


def test_the_face_has_exactly_the_parts_methods() -> None:
    """Every part's operation is on PayoutStore, and PayoutStore has no operation of its own."""
    assert sum(len(public_methods(p)) for p in PARTS) == len(OWNER), "two parts share a name"
    assert public_methods(PayoutStore) == set(OWNER)


@pytest.mark.parametrize("name", sorted(OWNER))
def test_each_delegating_method_repeats_its_parts_signature(name: str) -> None:
    """Names, kinds, defaults and annotations (as spelled) are equal on both sides."""
    face = inspect.signature(getattr(PayoutStore, name))
    part = inspect.signature(getattr(OWNER[name], name))
    assert face == part, f"PayoutStore.{name}{face} != {OWNER[name].__name__}.{name}{part}"


def test_the_comparison_sees_a_different_default() -> None:
    """Negative control: two signatures that differ only in one default are told apart."""

    def a(x: int = 1) -> None: ...

    def b(x: int = 2) -> None: ...

    assert inspect.signature(a) != inspect.signature(b)
