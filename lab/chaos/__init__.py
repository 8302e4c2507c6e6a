"""The seeded chaos run (`payouts-lab chaos`, docs/chaos.md): faults on the whole local stack.

Owns: the fault schedule, a pure function of the seed (`lab.chaos.schedule`), the injector that
applies it (`lab.chaos.faults`, with the lock, replica and hostile-signal faults beside it), the
run itself (`lab.chaos.run`, with its options `lab.chaos.options`, its workload
`lab.chaos.workload` and its settling `lab.chaos.settle`), its downstream check and its summary,
and its command.
Must never: repair what a fault broke, or move money except through the system's entry points.
"""
