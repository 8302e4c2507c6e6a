"""Finance ledger stand-in: the downstream general ledger the outbox publisher delivers to.

Owns: a durable book of records keyed by correlation id (the outbox's idempotency key; a SQLite
file at `FINLEDGER_BOOK_PATH` that a restarted ledger reopens, in memory without it), the
write endpoint's answers -- created (201), duplicate (200: same id, same content), conflict (409:
same id, different content), unknown account (404, permanent) -- injectable transient failures
(503, dropped connections) and latency set at start-up, at run time through `/admin/faults`, or
deterministically per request by rules, and a request history the tests read as evidence.

Must never: record a second entry under a correlation id it already holds (before or after a
restart on the same book), answer a write before its record is on disk, overwrite a record
with different content (that is the 409 the publisher holds for an operator), record anything
for a request it answers with a failure (unless a rule says the reply is lost *after* recording,
which is the crash window the publisher must survive), or talk to the payment database.
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from finledger.app import create_app
    from finledger.faults import Action, Faults, Rule
    from finledger.settings import FinledgerSettings

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "Action": "finledger.faults",
    "Faults": "finledger.faults",
    "FinledgerSettings": "finledger.settings",
    "Rule": "finledger.faults",
    "create_app": "finledger.app",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "Action",
    "Faults",
    "FinledgerSettings",
    "Rule",
    "create_app",
]
