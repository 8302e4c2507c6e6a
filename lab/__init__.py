"""The lab: what proves the design by running it, and by breaking it on purpose.

Owns: the demo (`lab.demo`), the pause and crash experiments (`lab.experiments`), the seeded chaos
harness (`lab.chaos*`), the game day (`lab.gameday*`) and the benchmarks (`lab.bench_locks`,
`lab.bench_floor`, `lab.bench_e2e`), with their `payouts` subcommands (`lab.*_cli`).
Must never: be imported by a component or the worker (it sits at the top, with `payouts/` and
`stack/`), repair what it finds, or move money except through the system's own entry points.
"""
