"""The experiments that prove the design on the real local stack (`payouts-lab experiment`).

Owns: the pause and crash experiments (UC-03, UC-04) and the stack configuration the lab's runs
share (`lab.experiments.pause_crash`), and their command.
Must never: weaken fencing unless the experiment says so (its `--fencing off` control).
"""
