"""The fenced payout store over an asyncpg pool: the first fencing enforcement point (FR-15).

`PayoutStore` is composed of one mixin per concern, each in its own module here:

| module | what |
|---|---|
| `base` | the pool, the fencing switch (FR-29), the grant and assertion verifiers |
| `grant_checks` | the grant of the payout's account for the token, before any write (INV-07) |
| `fenced` | the fencing rule and the one fenced statement every transition runs (FR-15, FR-16) |
| `steps` | the worker's steps: claim, stamp the account's fence, submit, ack, decline, post |
| `ambiguity` | RAIL_AMBIGUOUS in and out: ambiguous, resolve settled/absent, abandon; audit rows |
| `commands` | operator commands: verified at acceptance, nonce recorded (single use), ended once |
| `seeding` | accounts, funding, new payouts (not fenced) |
| `reads` | balance, one payout, payouts by state or account |
"""

from __future__ import annotations

from common.lockkey import lock_key
from ledger.records import AlreadyAdvanced, Payout
from ledger.store.ambiguity import AmbiguityActions
from ledger.store.commands import CommandVerdict, OperatorCommands
from ledger.store.reads import Reads
from ledger.store.seeding import Seeding
from ledger.store.steps import WorkerSteps

__all__ = ["AlreadyAdvanced", "CommandVerdict", "Payout", "PayoutStore", "lock_key"]


class PayoutStore(WorkerSteps, AmbiguityActions, OperatorCommands, Seeding, Reads):
    """Accounts, funding, payouts and their fenced transitions, postings, and reads."""
