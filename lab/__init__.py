"""The lab: what proves the design by running it, and by breaking it on purpose.

Owns, one subpackage each: the demo (`lab.demo`), the pause and crash experiments
(`lab.experiments`), the seeded chaos run (`lab.chaos`), the game day (`lab.gameday`), the
benchmarks (`lab.bench`), the compose smoke run (`lab.compose`) and the Temporal UI screenshots
(`lab.screenshots`), each with its command (`lab.*.cli`); and `lab.stoppable`, which those
commands share.
Must never: be imported by anything else, `payouts/` and `stack/` included (it sits at the very
top, above both, which it drives), repair what it finds, or move money except through the
system's own entry points.
"""
