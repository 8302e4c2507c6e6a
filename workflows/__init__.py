"""Temporal workflows: the payout state machine (PayoutWorkflow) and reconciliation.

Owns: orchestration only, i.e. which step runs next, on which task queue, with which timeouts
and retry policy. Must never: perform I/O, read clocks or randomness outside the workflow API,
retry a rail submission, or decide recovery by elapsed time instead of state and evidence.
The one client-side module, never run inside a workflow: the Temporal Schedule that starts
reconciliation (`workflows.reconcile_schedule`), beside the workflow it starts.
"""
