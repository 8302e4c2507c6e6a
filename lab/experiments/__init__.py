"""The experiments that prove the design on the real local stack (`payouts-lab experiment`).

Owns: the pause and crash experiments (UC-03 `lab.experiments.pause`, UC-04
`lab.experiments.crash`), the settings and stack configuration the lab's runs share
(`lab.experiments.harness`), the evidence they gather (`lab.experiments.evidence`), and their
command.
Must never: weaken fencing unless the experiment says so (its `--fencing off` control).
"""
