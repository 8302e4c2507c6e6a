"""The operator's command line: `payouts ...`, the one console script of the project.

Owns: the router (`payouts.cli`: the parser, `payouts db migrate`, and the command modules it
loads), the payout, seed and lock commands (`payouts.commands`), and the commands of the jobs and
processes an operator runs or drives (`payouts.outbox_cli`, `payouts.reconcile_cli`,
`payouts.invariants_cli`); the stack's and the lab's commands live beside their code
(`stack.cli`, `lab.*.cli`) and are loaded by the router.
Must never: be imported by a component or the worker (it sits at the top, with `stack/` and
`lab/`), hold a component's logic (each command calls the component's public API), or print a
secret.
"""
