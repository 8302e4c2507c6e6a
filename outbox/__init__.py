"""The outbox publisher: one process that delivers the payment database's outbox rows downstream.

Owns: claiming due rows of `paydb.outbox`, delivering each to the finance ledger with the
publisher's own credential (`outbox.delivery`), writing each outcome back in one fenced UPDATE,
the operator's list/retry/discard of dead letters (`outbox.ops`), the `outbox_*` metrics
(`outbox.metrics`) and the publisher as a process (`outbox.service`, `python -m outbox`). The
rows themselves are written by the payment database in the same transaction as the change they
announce (`ledger.outbox`).
Must never: write any table but `paydb.outbox` and the audit rows of its operator actions, post to
the ledger itself, or deliver a row whose claim it lost (the UPDATE is fenced by its claim).
"""
