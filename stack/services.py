"""The commands of the stack's child processes (docs/architecture.md, "Processes"): the Temporal
dev server, the lock servers, the rail stub, the rail proxies, the finance-ledger stand-in, the
outbox publishers, the balancer in front of the replicas, and the workers.

Owns: how each service is started (argv, its own settings variables, health check) from the
stack's addresses; what every child gets alike (environment, database role, TLS, credentials) is
`stack.service_env`. Must never: start anything itself, or weaken fencing unless `fencing` is
False (FR-29).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping, Sequence

from stack.balancer import Pool, haproxy_binary, write_config
from stack.config import StackConfig
from stack.embedded.temporal import temporal_binary
from stack.process import ManagedProcess, command_check, http_check
from stack.service_env import PROJECT_ROOT, Addresses, ServiceEnv, flag
from workflows.search_attributes import dev_server_flags

__all__ = [
    "TEMPORAL_SQLITE_PRAGMAS",
    "WORKER_SCRIPT",
    "ServiceFactory",
    "finledger_available",
    "worker_available",
]

WORKER_SCRIPT = PROJECT_ROOT / "worker_main.py"
#: The dev server's SQLite in WAL mode with NORMAL sync: it survives a crash of the server process
#: (only an OS crash can lose the last commits), and every task no longer waits for an fsync,
#: which on a 2-core machine is the difference between a busy and a saturated Temporal.
TEMPORAL_SQLITE_PRAGMAS = (
    "--sqlite-pragma",
    "journal_mode=wal",
    "--sqlite-pragma",
    "synchronous=normal",
)


def finledger_available() -> bool:
    # Children run from the project root (`python -m` puts it on sys.path), so a package there
    # counts even before the editable install learned about it.
    if (PROJECT_ROOT / "finledger" / "__init__.py").exists():
        return True
    return importlib.util.find_spec("finledger") is not None


def worker_available() -> bool:
    return WORKER_SCRIPT.exists()


class ServiceFactory:
    """Builds each child process of one stack from its config and addresses."""

    def __init__(
        self, config: StackConfig, addresses: Addresses, base_env: Mapping[str, str]
    ) -> None:
        self.config = config
        self.addr = addresses
        self.common = ServiceEnv(config, addresses, base_env)

    def temporal(self) -> ManagedProcess:
        p = self.config.ports
        binary = temporal_binary()
        health_cmd = [binary, "operator", "cluster", "health", "--address"]
        server_ok = command_check([*health_cmd, self.addr.temporal_address])
        ui_ok = http_check(self.addr.ui_url)

        async def health() -> bool:
            return await server_ok() and await ui_ok()

        return ManagedProcess(
            name="temporal",
            argv=[
                binary,
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(p.temporal),
                "--ui-port",
                str(p.temporal_ui),
                # Set, not left to the dev server's random choice: every port is known and moved
                # by its variable.
                "--http-port",
                str(p.temporal_http),
                "--metrics-port",
                str(p.temporal_metrics),
                *dev_server_flags(),
                "--db-filename",
                str(self.config.run_dir / "temporal.db"),
                *TEMPORAL_SQLITE_PRAGMAS,
                # Every task hand-off waits for the next read of the one shard's transfer queue;
                # the dev server reads it at most 20 times a second unless told otherwise.
                "--dynamic-config-value",
                f"history.transferProcessorMaxPollRPS={self.config.temporal_transfer_rps}",
                "--log-level",
                "warn",
                # Every line of its log JSON (the stack's logs read with jq): the server's logs
                # as JSON objects, and no text banner of addresses (`-o json`; the stack prints
                # them).
                "--log-format",
                "json",
                "--output",
                "json",
                "--ui-disable-news-fetch",  # no outbound call from a local stack
            ],
            env=self.common.env("temporal", {}),
            log_path=self.common.logs / "temporal.log",
            health=health,
            health_what="`temporal operator cluster health` and the Web UI answering",
            url=self.addr.temporal_address,
            port=p.temporal,
        )

    def lock_server(self, name: str = "lock-server", port: int | None = None) -> ManagedProcess:
        """One lock server: the only one on the lock port, or replica `name` on its own `port`
        behind the balancer (issue 26 §1)."""
        port = port or self.config.ports.lock
        replicated = name != "lock-server"
        own = {
            "LOCK_BACKEND": self.config.backend,
            "LOCK_HOST": "127.0.0.1",
            "LOCK_PORT": str(port),
            **self.common.db("lock", "LOCK_DATABASE_URL"),
            "LOCK_SIGNING_KEY_PATH": str(self.common.grant_keys.private_path),
            "LOCK_SIGNING_KEY_ID": self.common.grant_keys.kid,
            "LOCK_CREDENTIALS_PATH": str(self.common.credentials.servers["lock-server"]),
            # INV-04: the issuance watermark, outside the backend's data (as compose and the
            # manifests give it a volume): a backend restored beneath this stack is refused.
            # Each replica keeps its own (the watermark is what THIS process has issued).
            "LOCK_STATE_DIR": str(
                self.common.lock_state_dir / name if replicated else self.common.lock_state_dir
            ),
            "LOCK_REPLICA_ID": name,
            **self.common.server_tls("LOCK_", "lock-server"),
        }
        if self.addr.etcd_endpoints:
            own["LOCK_ETCD_ENDPOINTS"] = ",".join(self.addr.etcd_endpoints)
        if self.addr.tls is not None and self.addr.tls.has_etcd:
            # The embedded etcd is https:// only and wants a client certificate: its own one.
            own.update(self.addr.tls.etcd_client_env("LOCK_", "lock-server"))
        base = self._replica_url(self.addr.lock_url, port)
        url = f"{base}/health"
        return self.common.python(
            name,
            ["-m", "lockservice", "serve"],
            own,
            self.common.check(url, json_status="ok"),
            f"GET {url}",
            url=base,
            port=port,
        )

    @staticmethod
    def _replica_url(service_url: str, port: int) -> str:
        """A replica's own address: the service's scheme and host on the replica's port."""
        scheme_host = service_url.rsplit(":", 1)[0]
        return f"{scheme_host}:{port}"

    def railstub(self) -> ManagedProcess:
        port = self.config.ports.railstub
        url = f"{self.addr.railstub_url}/health"
        return self.common.python(
            "railstub",
            ["-m", "railstub"],
            {
                "RAILSTUB_HOST": "127.0.0.1",
                "RAILSTUB_PORT": str(port),
                # Durable beside the stack's other state: a restarted stub (`payouts up` again,
                # a chaos restart) still knows every movement, as a real rail keeps its records.
                "RAILSTUB_MOVEMENTS_PATH": str(self.config.run_dir / "railstub-movements.sqlite"),
                "RAILSTUB_CREDENTIALS_PATH": str(self.common.credentials.servers["railstub"]),
                **self.common.server_tls("RAILSTUB_", "railstub"),
            },
            self.common.check(url),
            f"GET {url}",
            url=self.addr.railstub_url,
            port=port,
        )

    def railproxy(self, name: str = "railproxy", port: int | None = None) -> ManagedProcess:
        """One rail proxy: the only one, or replica `name` on its own `port` behind the
        balancer. Every replica shares the Connection's budget in the database (STD01-07/08,
        railproxy.budget) and records its own identity on every attempt."""
        port = port or self.config.ports.railproxy
        own = {
            "RAILPROXY_HOST": "127.0.0.1",
            "RAILPROXY_PORT": str(port),
            "RAILPROXY_REPLICA_ID": name,
            **self.common.db("railproxy", "RAILPROXY_DATABASE_URL"),
            "RAILPROXY_RAIL_URL": self.addr.railstub_url,
            "RAILPROXY_GRANT_PUBLIC_KEYS": str(self.common.grant_keys.public_dir),
            "RAILPROXY_CREDENTIALS_PATH": str(self.common.credentials.servers["railproxy"]),
            "RAILPROXY_TOKEN_FILE": str(self.common.credentials.tokens["railproxy"]),
            # FR-29: the proxy's fence and per-payout submission guard are what stop a second
            # rail movement when a paused holder wakes up; only the experiment turns them off.
            "RAILPROXY_ENFORCE_FENCING": flag(self.config.fencing),
            "RAILPROXY_ENFORCE_SUBMISSION_GUARD": flag(self.config.fencing),
            # ... and so is the grant check (INV-07): a paused holder's grant has expired by its
            # own statement when it thaws, which alone would refuse it and hide the duplicate
            # the negative control must show.
            "RAILPROXY_VERIFY_GRANTS": flag(self.config.fencing),
            # With them off the proxy starts only in experiment mode, which it verifies by asking
            # its rail (the local stub) to identify itself (railproxy.startup).
            "RAILPROXY_EXPERIMENT_MODE": flag(not self.config.fencing),
            **self.common.server_tls("RAILPROXY_", "railproxy"),
            **self.common.client_tls("RAILPROXY_"),  # the rail's certificate
        }
        base = self._replica_url(self.addr.railproxy_url, port)
        url = f"{base}/health"
        return self.common.python(
            name,
            ["-m", "railproxy"],
            own,
            self.common.check(url),
            f"GET {url}",
            url=base,
            port=port,
        )

    def finledger(self) -> ManagedProcess:
        port = self.config.ports.finledger
        own = {
            "FINLEDGER_HOST": "127.0.0.1",
            "FINLEDGER_PORT": str(port),
            "FINLEDGER_CREDENTIALS_PATH": str(self.common.credentials.servers["finledger"]),
            # Durable beside the stub's log: a restarted ledger (`payouts up` again, a chaos
            # restart) still knows every posting it booked and answers a redelivery duplicate.
            "FINLEDGER_BOOK_PATH": str(self.config.run_dir / "finledger-book.sqlite"),
            **self.common.server_tls("FINLEDGER_", "finledger"),
        }
        return self.common.python(
            "finledger",
            ["-m", "finledger"],
            own,
            self.common.check(f"{self.addr.finledger_url}/health"),
            f"GET {self.addr.finledger_url}/health",
            url=self.addr.finledger_url,
            port=port,
        )

    def outbox(self, name: str = "outbox", port: int | None = None) -> ManagedProcess:
        """One outbox publisher; replicas claim disjoint batches (FOR UPDATE SKIP LOCKED,
        outbox.ops), and the ledger answers a redelivered event as a duplicate."""
        port = port or self.config.ports.outbox_metrics
        url = f"{self.common.scheme()}://127.0.0.1:{port}"
        own = {
            **self.common.db("outbox", "OUTBOX_DATABASE_URL"),
            "OUTBOX_FINLEDGER_URL": self.addr.finledger_url,
            "FINLEDGER_URL": self.addr.finledger_url,
            "OUTBOX_METRICS_PORT": str(port),
            "OUTBOX_PUBLISHER_ID": name,
            "OUTBOX_TOKEN_FILE": str(self.common.credentials.tokens["outbox"]),
            **self.common.client_tls("OUTBOX_"),  # the finance ledger's certificate
            **self.common.server_tls("OUTBOX_", "outbox"),  # its own /metrics
        }
        return self.common.python(
            name,
            ["-m", "outbox"],
            own,
            self.common.check(f"{url}/metrics"),
            f"GET {url}/metrics",
            url=url,
            port=port,
        )

    def balancer(self, pools: Sequence[Pool]) -> ManagedProcess:
        """HAProxy in front of the replicated lock servers and rail proxies (stack.balancer),
        healthy once each service answers /health through it."""
        tls = self.addr.tls
        config = write_config(
            self.config.run_dir / "balancer" / "haproxy.cfg",
            pools,
            ca_file=tls.ca_file if tls else None,
        )
        checks = [
            self.common.check(f"{self.addr.lock_url}/health", json_status="ok"),
            self.common.check(f"{self.addr.railproxy_url}/health"),
        ]

        async def health() -> bool:
            return all([await check() for check in checks])

        return ManagedProcess(
            name="balancer",
            # -db: in the foreground, in the stack's process group; its text lines become JSON
            # events in its log file (stack.jsonwrap).
            argv=[
                sys.executable,
                "-m",
                "stack.jsonwrap",
                "balancer",
                "--",
                haproxy_binary(),
                "-db",
                "-f",
                str(config),
            ],
            env=self.common.env("balancer", {}),
            log_path=self.common.logs / "balancer.log",
            health=health,
            health_what=f"GET {self.addr.lock_url}/health and {self.addr.railproxy_url}/health",
            cwd=PROJECT_ROOT,
        )

    def worker(
        self, name: str, metrics_port: int, sdk_metrics_port: int, env_overrides: Mapping[str, str]
    ) -> ManagedProcess:
        own = {
            # Bytecode for the workflow sandbox, which imports the workflow module afresh for
            # every workflow run: without a .pyc (PYTHONDONTWRITEBYTECODE, an editable install)
            # it compiles workflows/payout.py from source each time, ~3.5 ms of CPU per payout
            # (docs/performance.md). Cached under the run directory, not in the source tree; an
            # installed package (the image) has its .pyc from pip already.
            "PYTHONDONTWRITEBYTECODE": "",
            "PYTHONPYCACHEPREFIX": str(self.config.run_dir / "pycache"),
            "WORKER_TEMPORAL_ADDRESS": self.addr.temporal_address,
            **self.common.db("worker", "WORKER_DATABASE_URL", "RECONCILE_DATABASE_URL"),
            "WORKER_LOCK_URL": self.addr.lock_url,
            "WORKER_RAILPROXY_URL": self.addr.railproxy_url,
            "WORKER_GRANT_PUBLIC_KEYS": str(self.common.grant_keys.public_dir),
            "WORKER_TOKEN_FILE": str(self.common.credentials.tokens["worker"]),
            # The hourly reconcile Schedule runs in the workers, as the reconciler component.
            "RECONCILE_TOKEN_FILE": str(self.common.credentials.tokens["reconciler"]),
            "WORKER_ID": name,
            "WORKER_METRICS_PORT": str(metrics_port),
            "WORKER_SDK_METRICS_PORT": str(sdk_metrics_port),
            # FR-29: the worker's own fencing checks; off only for the negative-control experiment.
            "WORKER_ENFORCE_FENCING": flag(self.config.fencing),
            "WORKER_VERIFY_GRANTS": flag(self.config.fencing),
            # Off is refused outside experiment mode, which the worker verifies at the proxy.
            "WORKER_EXPERIMENT_MODE": flag(not self.config.fencing),
            "WORKER_TASK_QUEUE": self.config.task_queue,
            # The hourly reconcile Schedule runs in the workers: it reads this stack's rail log,
            # on whatever port the stack gave the stub.
            "RECONCILE_RAIL_ADMIN_URL": self.addr.railstub_url,
            # The lock server's, the proxy's and (for the reconcile activity) the rail's.
            **self.common.client_tls("WORKER_"),
            **self.common.server_tls("WORKER_", "worker"),  # its own /metrics and /health
        }
        url = f"{self.common.scheme()}://127.0.0.1:{metrics_port}"
        proc = self.common.python(
            name,
            [str(WORKER_SCRIPT)],
            own,
            self.common.check(f"{url}/health"),
            f"GET {url}/health (Temporal connected, lock session not past its deadline)",
            url=url,
            port=metrics_port,
        )
        proc.env = {**proc.env, **env_overrides}
        return proc
