"""Lock service: sessions, leases and strictly increasing fencing tokens over two backends
(PostgreSQL and etcd), served over HTTP, with an async client SDK and operator commands.

Three parts, each with its own public face (docs/architecture.md, "Layout and ownership"):
`lockservice.server` (the HTTP app, its signing key, the backends, restore), `lockservice.sdk`
(the client a worker links in) and `lockservice.verifiers` (offline checks of signed grants and
operator assertions, for the enforcement points). Shared by all three: `lockservice.api`, the
lock contract. Here at the top: the operator commands (`lockservice.cli`, `python -m
lockservice`).

Owns: who holds `payout:{account}` right now, the token sequence of every key, and the signing
key that makes each grant verifiable offline (lockservice.server.signing signs,
lockservice.verifiers checks; INV-07).
Must never: reissue or lower a token for a key (INV-04), let two grants of one key be valid at once
(INV-06), decide lease expiry by a client's clock, offer a way to proceed without a grant
(FR-27), hand out an unsigned grant, or let its private key leave the lock server.
A lock alone is not mutual exclusion: the resources must check the token (see README, fencing).
"""
