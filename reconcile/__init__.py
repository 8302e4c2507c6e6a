"""The reconciler: one job that compares every record of a closed window and reports each break.

Owns: the read-only evidence queries across `paydb` and `railproxy` (`reconcile.reconciler`), the
pure classification of discrepancies (`reconcile.rules`), the `reconcile.*` events and the
`reconcile_*` metrics.
Must never: write anything, anywhere; repair, resubmit or post; or import the payment database's
store (it reads the database as the read-only `payouts_reconciler` role).
"""
