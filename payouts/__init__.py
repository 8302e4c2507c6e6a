"""The operator's command line, `payouts ...`: `payouts.cli` routes each subcommand to the module
that registers it (COMMAND_MODULES).

Owns: the workload and operator commands (`payouts.commands` fans out to `seed_cli`,
`payout_cli`, `operator_cli`), the component commands (`outbox_cli`, `reconcile_cli`,
`invariants_cli`), `payouts db migrate`, and the look-ups they share (`payouts.settings`).
Must never: be imported by a component or the worker (it sits at the top, with `stack/` and
`lab/`), or move money except by starting the payout's own workflow.
"""
