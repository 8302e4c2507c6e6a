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

from railstub.app import create_app
from railstub.behaviour import Action, Behaviour, Rule
from railstub.settings import StubSettings

__all__ = ["Action", "Behaviour", "Rule", "StubSettings", "create_app"]
