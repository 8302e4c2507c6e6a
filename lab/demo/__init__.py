"""The demo (`make demo`, `payouts-lab demo`): the main job on embedded defaults.

Owns: the run (`lab.demo.run`: stack, payouts, the pause experiment, reconciliation,
invariants), its report as a person reads it (`lab.demo.report`) and its command.
Must never: report a check as held that it did not run.
"""
