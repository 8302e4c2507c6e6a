"""The invariant checker: one read-only job computing INV-01..INV-10 from every source of evidence.

Owns: the evidence queries and sources (`invariants.checker`), the pure rules (`invariants.rules`),
the `invariants.*` events and the `invariants_*` metrics.
Must never: write anything, anywhere (in Temporal it only lists and describes workflows), repair,
resubmit, revoke, or terminate a workflow.
"""
