"""Rail stub: a stand-in for the third-party payment rail, non-idempotent by design (FR-21, A-07).

Owns: a durable movement log (SQLite at `RAILSTUB_MOVEMENTS_PATH`; the evidence of a duplicate
payment: every instruction it receives is a new movement, recorded at receipt, even for a client
reference it has already seen), injectable behaviours (latency, business decline, timeouts before
and after handoff, delayed completion, outage, ambiguity, clock skew) set at start-up, at run time
through `/admin/behaviour`, or deterministically per request by rules, and a read-only, eventually
consistent lookup by client reference with its consistency statement (A-08).

Must never: deduplicate submissions (that would hide exactly the bug the project guards against),
record anything for a request it rejects as invalid or unavailable, let a lookup change state, or
state completeness for a time for which its log lacks records.
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from railstub.app import create_app
    from railstub.behaviour import Action, Behaviour, Rule
    from railstub.settings import StubSettings

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "Action": "railstub.behaviour",
    "Behaviour": "railstub.behaviour",
    "Rule": "railstub.behaviour",
    "StubSettings": "railstub.settings",
    "create_app": "railstub.app",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "Action",
    "Behaviour",
    "Rule",
    "StubSettings",
    "create_app",
]
