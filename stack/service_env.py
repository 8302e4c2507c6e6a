"""What every child process of the stack gets (`ServiceEnv`): its environment, its own database
role and password file, its TLS variables, the grant keys and credentials it may see, its health
check, and the command of a Python service; and where the stack's services answer (`Addresses`).

Owns: the settings common to every child, from the stack's addresses. Must never: start anything
itself, give a child the admin DSN, or give a child another process's token or key (each gets
only its own, docs/architecture.md, Trust). The services themselves: `stack.services`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.tracing import TRACE_DIR_VAR
from lockservice.server import KeyPairFiles, generate_keypair
from stack.config import StackConfig
from stack.credentials import StackCredentials, stack_credentials
from stack.pki import StackTLS
from stack.process import HealthCheck, ManagedProcess, http_check

__all__ = ["PROJECT_ROOT", "STACK_KEY_ID", "Addresses", "ServiceEnv", "flag"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: Key id of the local stack's grant-signing key (lockservice.server.signing).
STACK_KEY_ID = "stack-k1"


@dataclass(frozen=True)
class Addresses:
    """Where every service of a started stack answers."""

    database_url: str
    etcd_endpoints: tuple[str, ...]
    temporal_address: str
    ui_url: str
    lock_url: str
    railstub_url: str
    railproxy_url: str
    finledger_url: str
    #: Per-component DSNs by variable (no passwords), and the folder of the libpq password
    #: files each process gets as PGPASSFILE (common/db_roles.py).
    role_urls: Mapping[str, str] = field(default_factory=dict)
    pgpass_dir: str = ""
    #: The stack's CA and certificates (None: plain HTTP, `PAYOUTS_TLS=false`).
    tls: StackTLS | None = None


def flag(value: bool) -> str:
    """A boolean setting variable's value."""
    return "true" if value else "false"


class ServiceEnv:
    """The settings every child process of one stack gets, from its config and addresses."""

    def __init__(
        self, config: StackConfig, addresses: Addresses, base_env: Mapping[str, str]
    ) -> None:
        self.config = config
        self.addr = addresses
        self.base_env = base_env
        self.logs = config.run_dir / "logs"
        self._keys: KeyPairFiles | None = None
        self._creds: StackCredentials | None = None

    @property
    def grant_keys(self) -> KeyPairFiles:
        """The stack's grant-signing key pair under `<run dir>/keys/`, generated on first start
        and kept for the next (INV-07): the private key (0600) goes only to the lock server, the
        public directory to the rail proxy and the workers."""
        if self._keys is None:
            self._keys = generate_keypair(self.config.run_dir / "keys", STACK_KEY_ID)
        return self._keys

    @property
    def lock_state_dir(self) -> Path:
        """The lock server's LOCK_STATE_DIR, kept across restarts like the backend's data."""
        return self.config.run_dir / "lock-state"

    @property
    def credentials(self) -> StackCredentials:
        """The stack's bearer tokens: each process gets only its own token file and its own
        credentials file (docs/architecture.md, Trust)."""
        if self._creds is None:
            self._creds = stack_credentials(self.config.run_dir)
        return self._creds

    def env(self, name: str, own: Mapping[str, str]) -> dict[str, str]:
        """The whole environment of process `name`: the stack's, its `own`, then overrides."""
        env = dict(self.base_env)
        env["PYTHONUNBUFFERED"] = "1"
        # Every process's spans, one file each, under the run directory (common.tracing); a
        # collector (OTEL_EXPORTER_OTLP_ENDPOINT) takes precedence, OTEL_SDK_DISABLED=true: none.
        env[TRACE_DIR_VAR] = str((self.config.run_dir / "traces").resolve())
        # No child gets the admin DSN: each one connects with its own role (`db` below).
        if self.addr.etcd_endpoints:
            env["ETCD_ENDPOINTS"] = ",".join(self.addr.etcd_endpoints)
        env.update(own)
        env.update(self.config.service_env.get("*", {}))
        env.update(self.config.service_env.get(name, {}))
        return env

    def server_tls(self, prefix: str, name: str) -> dict[str, str]:
        tls = self.addr.tls
        return tls.server_env(prefix, name) if tls else {}

    def scheme(self) -> str:
        return "https" if self.addr.tls else "http"

    def client_tls(self, prefix: str) -> dict[str, str]:
        tls = self.addr.tls
        return tls.client_env(prefix) if tls else {}

    def check(self, url: str, *, json_status: str | None = None) -> HealthCheck:
        """GET url, verifying the server against the stack's CA when TLS is on."""
        tls = self.addr.tls
        verify = tls.client_context() if tls else True
        return http_check(url, json_status=json_status, verify=verify)

    def db(self, process: str, *variables: str) -> dict[str, str]:
        """The process's own role DSN(s) and a password file holding only its roles."""
        env = {var: self.addr.role_urls[var] for var in variables}
        env["PGPASSFILE"] = str(Path(self.addr.pgpass_dir) / f"{process}.pgpass")
        return env

    def python(
        self,
        name: str,
        args: list[str],
        own: Mapping[str, str],
        health: HealthCheck,
        health_what: str,
        *,
        url: str | None = None,
        port: int | None = None,
    ) -> ManagedProcess:
        """A Python service run from the project root with this interpreter."""
        return ManagedProcess(
            name=name,
            argv=[sys.executable, *args],
            env=self.env(name, own),
            log_path=self.logs / f"{name}.log",
            health=health,
            health_what=health_what,
            cwd=PROJECT_ROOT,
            url=url,
            port=port,
        )
