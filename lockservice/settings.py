"""Settings of one lock-server process (pydantic-settings, environment prefix `LOCK_`).

One `LockSettings` object per process, built in `main()`; nothing reads the environment elsewhere.
`DATABASE_URL` and `ETCD_ENDPOINTS` are read without the prefix because every component of the
project shares them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.tls import ServerTLS


class LockSettings(ServerTLS, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOCK_", extra="ignore")

    backend: Literal["postgres", "etcd"] = "postgres"
    host: str = "127.0.0.1"
    port: int = Field(default=8701, ge=1, le=65535)
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("LOCK_DATABASE_URL", "DATABASE_URL")
    )
    etcd_endpoints: str | None = Field(
        default=None, validation_alias=AliasChoices("LOCK_ETCD_ENDPOINTS", "ETCD_ENDPOINTS")
    )
    #: Namespace for every key (etcd key prefix); lets several deployments share one backend.
    key_prefix: str = ""
    #: Default session TTL for clients that do not choose one (A-04: 15 s).
    default_ttl_s: float = Field(default=15.0, ge=1.0, le=3600.0)
    #: etcd backend: how long a grant's record is kept after it ended (the invariant checker sees
    #: every grant that ended inside it). Sizing: docs/locks-backends.md.
    etcd_history_retention_s: float = Field(default=7 * 86400.0, ge=1.0)
    #: etcd backend: how often history is pruned and etcd compacted (each compaction keeps at least
    #: this much MVCC history, so waiters' watches rarely meet a compacted revision).
    etcd_compact_every_s: float = Field(default=300.0, ge=0.1)
    #: Restored-data detection: the issuance watermark lives here, OUTSIDE the backend's
    #: restorable data (lockservice.watermark). Unset: detection off (a warning at start-up).
    state_dir: str | None = None
    #: Ed25519 private key (PEM) that signs every grant; the server refuses to start without it.
    #: It never leaves this process: enforcement points get only the public key
    #: (docs/architecture.md#trust).
    signing_key_path: str | None = None
    #: The key id published with each signature; enforcement points look the public key up by it.
    signing_key_id: str = "k1"
    #: The accepted bearer tokens (common.credentials: SHA-256 digests -> identity, JSON, 0600);
    #: the server refuses to start without it.
    credentials_path: str | None = None
    #: Lifetime of the operator assertions `POST /v1/operator-assertions` issues (seconds).
    operator_assertion_ttl_s: float = Field(default=300.0, ge=1.0, le=3600.0)
    #: A worker-sent force-revoke needs a valid operator assertion (lockservice.assertions).
    #: false is an experiment switch (the negative control): the worker's revoke is carried out
    #: on the signal's free-text name, audited as `worker/unverified:<name>`.
    verify_operator_assertions: bool = True
    log_level: str = "INFO"

    def etcd_endpoint_list(self) -> list[str]:
        """`ETCD_ENDPOINTS` as "host:port" items (an `http://` scheme is tolerated and dropped)."""
        raw = self.etcd_endpoints or ""
        return [e.strip().removeprefix("http://") for e in raw.split(",") if e.strip()]
