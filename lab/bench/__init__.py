"""The benchmarks: what each part of the payout path costs, measured on the real stack.

Owns: the lock path (`lab.bench.locks`, with its floors and samples `lab.bench.locks_measure`,
its servers `lab.bench.locks_servers` and its A/B `lab.bench.locks_ab`), Temporal's floor for the
payout's shape (`lab.bench.floor`), the whole system beside that floor (`lab.bench.e2e`, its hot
account `lab.bench.hot`), the outbox path (`lab.bench.outbox`), PostgreSQL's TLS front
(`lab.bench.pgtls`), and what they measure with: CPU from /proc (`lab.bench.cpu`), Temporal's
RPC counters (`lab.bench.temporal_rpcs`) and order statistics (`lab.bench.stats`).
Must never: be started by the production worker or stack, or change what it measures to suit
a figure.
"""
