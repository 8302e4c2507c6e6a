"""Lock service: sessions, leases and strictly increasing fencing tokens over two backends
(PostgreSQL and etcd), served over HTTP, with an async client SDK and operator commands.

Owns: who holds `payout:{account}` right now, and the token sequence of every key.
Must never: reissue or lower a token for a key (INV-04), let two grants of one key be valid at once
(INV-06), decide lease expiry by a client's clock, or offer a way to proceed without a grant
(FR-27).
A lock alone is not mutual exclusion: the resources must check the token (see README, fencing).
"""
