"""Settings of the rail proxy (env prefix `RAILPROXY_`), one object per process."""

from __future__ import annotations

import os
import socket
from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.tls import ClientTLS, ServerTLS, refuse_unverified_database_url


def _default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class ProxySettings(ServerTLS, ClientTLS, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAILPROXY_", extra="ignore")

    database_url: str = "postgresql://localhost/payouts"
    rail_url: str = "http://127.0.0.1:8710"
    host: str = "127.0.0.1"
    port: int = 8720
    log_level: str = "INFO"

    # Lineage recorded on every attempt (STD01-09).
    adapter_version: str = "railproxy-stub-adapter/1.0.0"
    contract_version: str = "rail-submit/1"
    #: The Connection: the key of its shared budget too (every replica of one Connection must
    #: carry the same id and the same limits; docs/rail.md "Replicas").
    connection_id: str = "rail-stub"
    #: This replica's identity on every attempt it records and in its events (unique per
    #: process unless set: the pod name is a good value).
    replica_id: str = Field(default_factory=_default_replica_id, min_length=1, max_length=128)

    # Timeouts. The forward timeout is min(rail_timeout_s, time left to the caller's deadline).
    rail_timeout_s: float = Field(default=10.0, gt=0)  # A-07 timeout budget
    connect_timeout_s: float = Field(default=1.0, gt=0)
    min_useful_budget_s: float = Field(default=0.05, ge=0)

    # Circuit breaker (STD01-08): opens when, over the last `breaker_window` forwards with at
    # least `breaker_min_samples` of them, the failure ratio reaches `breaker_failure_ratio`.
    breaker_window: int = Field(default=20, ge=1)
    breaker_min_samples: int = Field(default=5, ge=1)
    breaker_failure_ratio: float = Field(default=0.5, gt=0, le=1)
    breaker_open_s: float = Field(default=5.0, gt=0)
    breaker_probe_timeout_s: float = Field(default=1.0, gt=0)

    # Bulkhead and rate limit of submissions: the Connection's, shared by every replica in the
    # database (railproxy.budget); the queue is each replica's own.
    max_concurrency: int = Field(default=32, ge=1)
    max_queue: int = Field(default=64, ge=0)
    rate_per_s: float = Field(default=200.0, gt=0)
    rate_burst: int = Field(default=200, ge=1)
    # The Connection's budget for lookups (every try of every lookup), apart from submissions':
    # a burst of recovery or reconciliation lookups never takes a submission's budget, and a
    # flood of submissions never keeps recovery from the evidence. The rail sees at most the sum.
    lookup_max_concurrency: int = Field(default=32, ge=1)
    lookup_rate_per_s: float = Field(default=200.0, gt=0)
    lookup_rate_burst: int = Field(default=200, ge=1)
    #: A slot is a lease of (the call's timeout + this): how long after a replica died mid-call
    #: (or its release was lost) the slot frees itself. Covers the gap between the proxy's and
    #: the database's clocks over one call, and the call's last bytes.
    budget_lease_margin_s: float = Field(default=2.0, gt=0)
    #: The shared budget's statements (take, release) answer within this or the call is refused
    #: STORE_UNAVAILABLE (NOT_SUBMITTED): a slow database delays no forward past it.
    budget_timeout_s: float = Field(default=1.0, gt=0)

    # Read-only lookups: bounded retry with exponential backoff and full jitter (STD01-07).
    lookup_attempts: int = Field(default=3, ge=1, le=10)
    lookup_base_delay_s: float = Field(default=0.05, ge=0)
    lookup_timeout_s: float = Field(default=2.0, gt=0)

    # The absence rule (docs/rail.md "When is a payout absent?"): a `not_found` proves that an
    # attempt never reached the rail only if the rail's stated completeness window covers it with
    # these margins. Both 0 is the old, unsafe rule (negative controls only).
    #: How long after the forward's deadline the rail may still ingest the request (connection
    #: and processing lag): >= A-03's 30 s latency tail, doubled.
    absence_ingest_bound_s: float = Field(default=60.0, ge=0)
    #: The largest skew between our clocks (proxy, database) and the rail's.
    absence_clock_skew_margin_s: float = Field(default=30.0, ge=0)

    # Health evidence window and freshness.
    health_window: int = Field(default=100, ge=1)
    health_valid_s: float = Field(default=5.0, gt=0)
    #: /health says DEGRADED above this share of technical failures among recent forwards.
    health_degraded_error_ratio: float = Field(default=0.05, ge=0, le=1)

    # FR-29: experiment-only switches. Off is logged loudly at start-up, and refused unless the
    # proxy is in experiment mode against the rail stub (see `railproxy.startup`).
    enforce_fencing: bool = True
    enforce_submission_guard: bool = True
    #: INV-07: every submission's grant must carry the lock service's signature. Off, a made-up
    #: token moves money and raises the account's high-water mark: negative control only.
    verify_grants: bool = True
    #: The lock service's public keys: a directory of `<kid>.pem` files or `kid=path,...`.
    #: Every key id listed is accepted (rotation); required while `verify_grants` is on.
    grant_public_keys: str | None = None
    # Experiment mode: the proxy starts only if its rail identifies itself as the rail stub
    # (`GET /admin/identity` answers {"rail": "stub"}), waiting at most `experiment_verify_s`
    # for it to answer. /health reports it as `experiment_mode`, which workers check in turn.
    experiment_mode: bool = False
    experiment_verify_s: float = Field(default=10.0, gt=0)

    db_pool_max: int = Field(default=10, ge=1)
    #: The accepted bearer tokens (common.credentials, `RAILPROXY_CREDENTIALS_PATH`): submits only
    #: from the worker; `python -m railproxy` refuses to start without it.
    credentials_path: str | None = None
    #: This proxy's own token for the rail (`RAILPROXY_TOKEN_FILE`): the rail authenticates its
    #: client. A file path, never the token itself.
    token_file: str | None = None

    @model_validator(mode="after")
    def _database_tls(self) -> Self:
        refuse_unverified_database_url(
            self.database_url, "RAILPROXY_DATABASE_URL", experiment_mode=self.experiment_mode
        )
        return self

    @model_validator(mode="after")
    def _breaker_can_open(self) -> Self:
        # The window never holds more than breaker_window results: above it the breaker could
        # never gather its minimum sample count, and would never open.
        if self.breaker_min_samples > self.breaker_window:
            raise ValueError(
                f"RAILPROXY_BREAKER_MIN_SAMPLES ({self.breaker_min_samples}) must not exceed "
                f"RAILPROXY_BREAKER_WINDOW ({self.breaker_window}): the breaker could never open"
            )
        return self

    def switches_off(self) -> list[str]:
        """The environment variables of the experiment-only switches that are turned off."""
        switches = {
            "RAILPROXY_ENFORCE_FENCING": self.enforce_fencing,
            "RAILPROXY_ENFORCE_SUBMISSION_GUARD": self.enforce_submission_guard,
            "RAILPROXY_VERIFY_GRANTS": self.verify_grants,
        }
        return [name for name, on in switches.items() if not on]
