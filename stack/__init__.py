"""The local stack: the whole system on one machine, behind `payouts up`, the lab and tests.

Owns: the embedded PostgreSQL, etcd and Temporal dev server (`stack.embedded`), the stack's
configuration (`stack.config`), starting, supervising and stopping every process of the system in
order (`stack.system.Stack`, `stack.services`, `stack.process`) and the `payouts up` command
(`stack.cli`). Must never: be imported by a component or the worker (it sits at the top, with
`payouts/` and `lab/`), leave a child process behind, or download anything at run time.
"""
