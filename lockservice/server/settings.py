"""Settings of one lock-server process (pydantic-settings, environment prefix `LOCK_`).

One `LockSettings` object per process, built in `main()`; nothing reads the environment elsewhere.
`DATABASE_URL` and `ETCD_ENDPOINTS` are read without the prefix because every component of the
project shares them. `https://` etcd endpoints are reached over mutual TLS with
`LOCK_ETCD_CA_FILE` / `LOCK_ETCD_CERT_FILE` / `LOCK_ETCD_KEY_FILE` (docs/security.md,
"Encryption in transit"); every combination that would reach etcd unverified or leave a file
unused is refused here, before anything starts.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.tls import ServerTLS, TLSSettingsError, refuse_unverified_database_url

if TYPE_CHECKING:
    from lockservice.server.backends.etcd_client import EtcdTLSFiles

_ENDPOINTS_VARS = "LOCK_ETCD_ENDPOINTS/ETCD_ENDPOINTS"


def _default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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
    #: etcd over TLS (`https://` endpoints): the CA that issued the members' certificates, and
    #: this server's client certificate and key (etcd's `--client-cert-auth`).
    etcd_ca_file: str | None = None
    etcd_cert_file: str | None = None
    etcd_key_file: str | None = None
    #: Namespace for every key (etcd key prefix); lets several deployments share one backend.
    key_prefix: str = ""
    #: This replica's identity (several lock servers share one backend behind a load balancer):
    #: in every audit record it writes, its start-up event and `/health` (unique per process
    #: unless set: the pod name is a good value).
    replica_id: str = Field(default_factory=_default_replica_id, min_length=1, max_length=128)
    #: Default session TTL for clients that do not choose one (A-04: 15 s).
    default_ttl_s: float = Field(default=15.0, ge=1.0, le=3600.0)
    #: etcd backend: how long a grant's record is kept after it ended (the invariant checker sees
    #: every grant that ended inside it). Sizing: docs/locks-backends.md.
    etcd_history_retention_s: float = Field(default=7 * 86400.0, ge=1.0)
    #: etcd backend: how often history is pruned and etcd compacted (each compaction keeps at least
    #: this much MVCC history, so waiters' watches rarely meet a compacted revision).
    etcd_compact_every_s: float = Field(default=300.0, ge=0.1)
    #: Restored-data detection: the issuance watermark lives here, OUTSIDE the backend's
    #: restorable data (lockservice.server.watermark). Unset: detection off (a warning at start-up).
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
    #: A worker-sent force-revoke needs a valid operator assertion
    #: (lockservice.verifiers.assertions).
    #: false is an experiment switch (the negative control): the worker's revoke is carried out
    #: on the signal's free-text name, audited as `worker/unverified:<name>`.
    verify_operator_assertions: bool = True
    log_level: str = "INFO"

    def etcd_endpoint_list(self) -> list[str]:
        """`ETCD_ENDPOINTS` as "host:port" items (an `http://` scheme is tolerated and dropped;
        `https://` is kept: it means TLS)."""
        raw = self.etcd_endpoints or ""
        return [e.strip().removeprefix("http://") for e in raw.split(",") if e.strip()]

    def etcd_tls(self) -> EtcdTLSFiles | None:
        """The etcd client's TLS files, None for plaintext endpoints (validated below)."""
        from lockservice.server.backends.etcd_client import EtcdTLSFiles

        if not self.etcd_ca_file:
            return None
        return EtcdTLSFiles(self.etcd_ca_file, self.etcd_cert_file, self.etcd_key_file)

    @model_validator(mode="after")
    def _database_tls(self) -> LockSettings:
        # The lock server has no experiment mode: its grants are never to cross a path unverified.
        refuse_unverified_database_url(self.database_url, "LOCK_DATABASE_URL")
        return self

    @model_validator(mode="after")
    def _etcd_tls_complete(self) -> LockSettings:
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            raise TLSSettingsError(
                "LOCK_ETCD_CERT_FILE and LOCK_ETCD_KEY_FILE are set together or not at all"
            )
        endpoints = self.etcd_endpoint_list()
        secure = {e.startswith("https://") for e in endpoints}
        if len(secure) > 1:
            raise TLSSettingsError(f"{_ENDPOINTS_VARS} mix https:// and plaintext endpoints")
        if secure == {True} and not self.etcd_ca_file:
            raise TLSSettingsError(
                f"{_ENDPOINTS_VARS} are https:// but LOCK_ETCD_CA_FILE is not set: the lock "
                "server verifies etcd's certificates against that CA, never without one"
            )
        files = self.etcd_ca_file or self.etcd_cert_file
        if secure == {False} and files:
            raise TLSSettingsError(
                f"LOCK_ETCD_CA_FILE/LOCK_ETCD_CERT_FILE are set but {_ENDPOINTS_VARS} are not "
                "https://: etcd would be reached in plaintext; write them as https://host:port"
            )
        if self.etcd_cert_file and not self.etcd_ca_file:
            raise TLSSettingsError("LOCK_ETCD_CERT_FILE is set without LOCK_ETCD_CA_FILE")
        return self
