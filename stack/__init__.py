"""The local stack: the whole system on one machine, behind `payouts up`, the lab and tests.

Owns: the embedded PostgreSQL, etcd and Temporal dev server (`stack.embedded`), the stack's
configuration (`stack.config`), starting, supervising and stopping every process of the system in
order (`stack.system.Stack`; its data stores `stack.datastores`, its other processes and
replicated front `stack.launcher`, the steps against running services `stack.bootstrap`, its
state files `stack.statefile`; each process's command `stack.services`, what every process gets
`stack.service_env`, `stack.process`), refusing to start over a taken port or a live earlier
stack (`stack.preflight`), the stack's identities and their tokens (`stack.credentials`), its
CA and certificates, and the certificate building the GKE deployment uses too (`stack.pki`), and
the `payouts up` command (`stack.cli`).
Must never: be imported by a component or the worker, import `payouts/` or `lab/` (the top is
ordered lab > payouts > stack: both drive the stack, never the reverse), leave a child process
behind, or download anything at run time.
"""
