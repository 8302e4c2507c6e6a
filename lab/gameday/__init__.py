"""The game day (`make gameday`, `payouts-lab gameday`): every alert caused for real (NFR-11).

Owns: the run (`lab.gameday.run`), its scenarios (`lab.gameday.scenarios`, `lab.gameday.ctx`),
a real Prometheus (`lab.gameday.prom`), the alert rules as data (`lab.gameday.rules`), the
runbooks' commands executed as written (`lab.gameday.runbooks`), a scratch reconciliation
world (`lab.gameday.scratch`) and its command.
Must never: touch a stack it did not start.
"""
