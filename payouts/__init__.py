"""The operator's command line: `payouts ...` (the lab has its own, `payouts-lab`, lab/cli.py).

Owns: the router (`payouts.cli`: the parser, `payouts db migrate`, the command groups it
registers, and the parsing, error and exit handling the lab's entry reuses), the payout, seed and
lock commands (`payouts.commands`), and the commands of the jobs and processes an operator runs
or drives (`payouts.outbox_cli`, `payouts.reconcile_cli`, `payouts.invariants_cli`); the stack's
commands live beside their code (`stack.cli`) and are registered by the router.
Must never: be imported by a component, the worker or the stack (it sits above `stack/` and
below `lab/`), import the lab, hold a component's logic (each command calls the component's
public API), or print a secret.
"""
