"""Typed errors of the invariant checker. When a source of evidence cannot be read completely, the
check reports nothing rather than a guess.

InvariantError                   code (a stable name) says which source failed
 +-- MovementsUnavailable        the rail's movement log could not be read
 +-- GrantSourceUnavailable      the lock service's grant history, or only part of it
 +-- WorkflowSourceUnavailable   Temporal could not be asked about the payout workflows
 +-- HoldSourceUnavailable       the locks held right now could not be read (INV-10)
"""

from __future__ import annotations


class InvariantError(Exception):
    """Base of the checker's errors. `code` is a stable machine-readable name."""

    code = "invariant_error"


class MovementsUnavailable(InvariantError):
    """The rail's movement log could not be read; nothing is reported rather than a guess."""

    code = "movement_source_unavailable"


class GrantSourceUnavailable(InvariantError):
    """The grant history could not be read completely; nothing is reported rather than a guess."""

    code = "grant_source_unavailable"


class WorkflowSourceUnavailable(InvariantError):
    """Temporal could not be asked about the payout workflows; nothing is reported."""

    code = "workflow_source_unavailable"


class HoldSourceUnavailable(InvariantError):
    """The locks held right now could not be read completely; nothing is reported."""

    code = "hold_source_unavailable"
