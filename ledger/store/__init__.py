"""The fenced payout store over an asyncpg pool: the first fencing enforcement point (FR-15).

`PayoutStore` is the public face; it owns no SQL. It builds one `FencedWriter` and hands it to the
parts that move a payout; each part is a plain object that receives what it uses in its
constructor and inherits nothing. Each part, its module, what it owns, and what it receives:

- `PayoutStore` (`payout_store`): the public methods, one per operation, each one call to the
  part below that owns it. Receives the pool, the two switches and the grant verifier; builds
  the parts.
- `FencedWriter`, `FencedTransaction` (`fenced`): the fencing rule and its switch (FR-15,
  FR-29), the balance-row stamp, the one fenced statement every transition runs, the report of
  a fenced rejection (FR-16). Receives the pool and the grant verifier.
- `GrantCheck` (`grant_checks`): the grant of the payout's account for the token, checked
  before any write (INV-07). Built and called by the writer only.
- `WorkerSteps` (`steps`): the worker's steps: claim, stamp the account's fence, submit, ack,
  decline, post. Receives the writer.
- `AmbiguityActions` (`ambiguity`): RAIL_AMBIGUOUS in and out: ambiguous, resolve settled or
  absent, abandon; audit rows of actions that change no state. Receives the pool, the writer and
  the assertion verifier.
- `OperatorCommands` (`commands`): operator commands verified at acceptance, nonce recorded
  (single use), ended once. Receives the pool and the assertion verifier.
- `Seeding` (`seeding`): accounts, funding, new payouts (not fenced). Receives the pool.
- `Reads` (`reads`): balance, one payout, payouts by state or account, the audit trail.
  Receives the pool.
- `base`: no object; the grant type, the logger, the lookups of a payout's account and of a
  customer account.

A fenced write reads in one line of calls: `PayoutStore.post` -> `WorkerSteps.post` ->
`FencedWriter.transaction` (grant checked, balance row stamped) -> `FencedTransaction.transition`
(the fenced UPDATE). Nothing in the store writes a payout's state any other way.

Why `PayoutStore` delegates method by method rather than exposing the parts as attributes: its
callers (activities, payouts, reconcile, invariants, lab, tests) keep the one API they have, mypy
checks every call against it, and there is one way to call each operation, not two. The price is
that each signature is written twice, in `PayoutStore` and in its part: mypy checks each
delegating call against the part, and `tests/ledger/test_store_face_unit.py` that the two
signatures (names, kinds, defaults, annotations) stay equal. No `__getattr__`: a reader follows a
call by reading.
"""

from __future__ import annotations

from common.lockkey import lock_key
from ledger.records import AlreadyAdvanced, Payout
from ledger.store.commands import CommandVerdict
from ledger.store.payout_store import PayoutStore

__all__ = ["AlreadyAdvanced", "CommandVerdict", "Payout", "PayoutStore", "lock_key"]
