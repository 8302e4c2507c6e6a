"""The invariant checker: one read-only job computing INV-01..INV-10 from every source of evidence.

Owns: the evidence queries, the report, the `invariants.*` events and the `invariants_*` metrics
(`invariants.checker`); the grant-history and Temporal sources (`invariants.sources`); the
evidence values (`invariants.evidence`) and the pure rules over them (`invariants.rules`); its
errors (`invariants.errors`).
Must never: write anything, anywhere (in Temporal it only lists and describes workflows), repair,
resubmit, revoke, or terminate a workflow.
"""
