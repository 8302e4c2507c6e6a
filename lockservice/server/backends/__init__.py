"""Lock backends behind one contract (`lockservice.api.LockBackend`), chosen by configuration.

Owns: the construction of a backend from settings values. Must never: let callers depend on a
concrete backend's extra methods for correctness; both backends have identical observable
semantics (FR-09), proven by one contract suite (tests/lockservice/test_contract.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from lockservice.api import InvalidRequest, LockBackend

if TYPE_CHECKING:
    from lockservice.server.backends.etcd_client import EtcdTLSFiles


async def create_backend(
    kind: Literal["postgres", "etcd"],
    *,
    database_url: str | None = None,
    etcd_endpoints: list[str] | None = None,
    prefix: str = "",
    etcd_history_retention_s: float | None = None,
    etcd_compact_every_s: float | None = None,
    etcd_tls: EtcdTLSFiles | None = None,
    replica_id: str | None = None,
) -> LockBackend:
    """A started backend; `prefix` namespaces every key so that users of one server never collide.

    With both `etcd_*` values, the etcd backend also runs retention and compaction (the lock
    server always passes them; tests that need a quiet etcd leave them out). `https://` etcd
    endpoints need `etcd_tls` (lockservice.server.backends.etcd_client). `replica_id` names the lock
    server in every audit record the backend writes (the lock server passes LOCK_REPLICA_ID;
    None for writers that are no lock server, such as the offline `bump-epoch`).
    Raises InvalidRequest for a missing address or an impossible retention, and
    BackendUnavailable if the server is down.
    """
    if kind == "postgres":
        if not database_url:
            raise InvalidRequest("the postgres lock backend needs a database_url")
        from lockservice.server.backends.postgres import PostgresBackend

        return await PostgresBackend.start(database_url, prefix, replica_id=replica_id)
    if kind == "etcd":
        if not etcd_endpoints:
            raise InvalidRequest("the etcd lock backend needs etcd_endpoints")
        from lockservice.server.backends.etcd import EtcdBackend
        from lockservice.server.backends.etcd_retention import RetentionPolicy

        policy = None
        if etcd_history_retention_s is not None and etcd_compact_every_s is not None:
            if not 0 < etcd_compact_every_s < etcd_history_retention_s:
                raise InvalidRequest("etcd compaction must run more often than the retention")
            policy = RetentionPolicy(etcd_history_retention_s, etcd_compact_every_s)
        return await EtcdBackend.start(
            etcd_endpoints, prefix, policy, etcd_tls, replica_id=replica_id
        )
    raise InvalidRequest(f"unknown lock backend {kind!r}")
