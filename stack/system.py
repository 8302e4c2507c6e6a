"""The whole system on one machine: `Stack`, the API behind `payouts up`, the demo and experiments.

Owns: starting PostgreSQL, etcd, the Temporal dev server, the lock server, the rail stub, the rail
proxy, the finance-ledger stand-in, the outbox publisher and N workers in order, each healthy
before the next; the addresses they answer on; and stopping every one of them. Must never:
leave a child process behind, start on a port that is already taken, or disable fencing unless
asked to (FR-29, loudly).

One object read whole (about 450 lines, over the ~400 of a module on purpose): `Stack` is the
face every driver holds (`payouts up`, the lab, the tests), so its addresses, credentials, TLS,
start order and chaos controls stay together; the work behind them is in modules of their own:
the embedded data stores (`stack.datastores`), the managed processes and the replicated front
(`stack.launcher`), the steps taken against running services (`stack.bootstrap`), the state
files (`stack.statefile`) and waiting (`stack.waiting`).

    async with Stack(StackConfig.from_env(workers=2)) as stack:
        stack.railproxy_url, stack.processes["worker-1"].pid
        stack.kill("worker-1", signal.SIGSTOP)      # a real stop-the-world pause
        await stack.restart("lock-server")
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from common.credentials import auth_headers, read_token
from common.db_roles import DSN_VARS, RoleFiles, generate_role_files, role_url
from common.logs import get_logger
from common.migrate import migrate
from common.tls import server_context
from stack import bootstrap
from stack.balancer import replica_names
from stack.config import StackConfig, StackError
from stack.credentials import STACK_OPERATOR, StackCredentials, stack_credentials
from stack.datastores import DataStores
from stack.embedded.shared import free_port
from stack.envfile import ENV_FILE_NAME
from stack.launcher import Launcher
from stack.pki import StackTLS, issue_stack_tls
from stack.preflight import check_ports, refuse_leftovers, safe_url
from stack.process import ManagedProcess, ProcessInfo
from stack.service_env import Addresses
from stack.services import ServiceFactory, finledger_available, worker_available
from stack.statefile import write_state

if TYPE_CHECKING:
    from lockservice.server import EtcdTLSFiles

log = get_logger("stack.system")

FENCING_OFF_WARNING = (
    "WARNING: FENCING IS OFF (FR-29, experiment only). The rail proxy accepts stale tokens and "
    "repeated submissions and the workers skip their fencing checks: a paused worker CAN move "
    "money twice. Never run this against a real rail."
)


class Stack:
    """The local stack. Use as `async with Stack(config) as stack:`; `stop()` is idempotent."""

    def __init__(
        self, config: StackConfig | None = None, *, progress: Callable[[str], None] | None = None
    ) -> None:
        cfg = config or StackConfig.from_env()
        run_dir = cfg.run_dir.resolve()
        self.config = replace(cfg, run_dir=run_dir, ports=cfg.ports.resolved())
        self.run_dir = run_dir
        #: Drawn at start, marked in its database and Temporal (stack.bootstrap.mark_stack).
        self.stack_id = ""
        self._progress = progress or (lambda _line: None)
        #: The embedded PostgreSQL (or pair) and etcd.
        self.stores = DataStores(self.config, run_dir, self._progress)
        #: Every other process: the lock server, rail stub and proxy, ledger, outbox, workers.
        self.launcher = Launcher(
            self.config, self._progress, on_change=lambda: self._write_state(stopped=False)
        )
        self._factory: ServiceFactory | None = None
        self._creds: StackCredentials | None = None
        #: True from the end of start-up to the beginning of stop (the env file exists).
        self._up = False
        self.addresses: Addresses | None = None
        self._roles: RoleFiles | None = None
        self._tls: StackTLS | None = None

    # ------------------------------------------------------------------ credentials

    @property
    def credentials(self) -> StackCredentials:
        """The stack's bearer tokens under `<run dir>/credentials/` (generated once, kept)."""
        if self._creds is None:
            self._creds = stack_credentials(self.run_dir)
        return self._creds

    def token(self, identity: str) -> str:
        """One identity's token (the operator's, or a component's for in-process checks)."""
        token = read_token(token_file=self.credentials.tokens[identity], what=identity)
        assert token is not None
        return token

    def operator_headers(self) -> dict[str, str]:
        """What the stack's own operator calls (admin endpoints of stub and ledger) present."""
        return auth_headers(self.token(STACK_OPERATOR))

    # ------------------------------------------------------------------ TLS

    @property
    def tls_ca_file(self) -> Path | None:
        """The CA every server's certificate chains to (None: TLS off or not started)."""
        return self._tls.ca_file if self._tls else None

    def server_context(self, name: str) -> ssl.SSLContext | None:
        """A server context with the certificate the stack issued to `name` (stack.pki.SERVERS),
        for a driver's own endpoint that stands in for that server; None with TLS off."""
        if self._tls is None:
            return None
        files = self._tls.certs[name]
        return server_context(str(files.cert), str(files.key))

    def etcd_client_tls(self) -> EtcdTLSFiles | None:
        """The files the stack's own etcd client presents (its leader checks; a driver's check
        of the cluster): None when etcd is plaintext, external or not used."""
        if self._tls is None or not self._tls.has_etcd or self.stores.etcd is None:
            return None
        return self._tls.etcd_client("stack")

    def client_verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify=` for a client of this stack's servers: a context trusting only
        the stack's CA, host name checked (True with TLS off: plain http needs none)."""
        return self._tls.client_context() if self._tls else True

    # ------------------------------------------------------------------ addresses

    def _addr(self) -> Addresses:
        if self.addresses is None:
            raise StackError("the stack is not started")
        return self.addresses

    @property
    def database_url(self) -> str:
        return self._addr().database_url

    @property
    def role_urls(self) -> dict[str, str]:
        """Per-component DSN variables (no passwords: see `pgpass_file`)."""
        return dict(self._addr().role_urls)

    @property
    def pgpass_file(self) -> Path:
        """The libpq password file with every role's password (for the operator's shell)."""
        return Path(self._addr().pgpass_dir) / "all.pgpass"

    def role_dsn(self, variable: str) -> str:
        """A component role's DSN with its password, for in-process use (demo, experiments,
        chaos seed and create payouts as the payment store): never print or log it."""
        if self._roles is None:
            raise StackError("the stack is not started")
        role = DSN_VARS[variable]
        return role_url(self.database_url, role, self._roles.passwords[role])

    @property
    def etcd_endpoints(self) -> tuple[str, ...]:
        return self._addr().etcd_endpoints

    @property
    def temporal_address(self) -> str:
        return self._addr().temporal_address

    @property
    def ui_url(self) -> str:
        return self._addr().ui_url

    @property
    def lock_url(self) -> str:
        return self._addr().lock_url

    @property
    def railstub_url(self) -> str:
        return self._addr().railstub_url

    @property
    def railproxy_url(self) -> str:
        return self._addr().railproxy_url

    @property
    def finledger_url(self) -> str | None:
        return self._addr().finledger_url if "finledger" in self.launcher.procs else None

    @property
    def processes(self) -> dict[str, ProcessInfo]:
        """Every running process by name (PostgreSQL and etcd only when embedded)."""
        return {**self.stores.processes(), **self.launcher.processes()}

    @property
    def workers(self) -> list[str]:
        return self.launcher.workers

    def service_replicas(self, service: str) -> list[str]:
        """The running processes of one service (`lock-server`, `railproxy`, `outbox`): the
        service itself, or its replicas `<service>-1` .. `<service>-N`."""
        return self.launcher.service_replicas(service)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Stack:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start everything in order, each healthy before the next; on any failure stop all."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Under root the embedded PostgreSQL runs as an unprivileged user that must reach pg/.
        self.run_dir.chmod(0o755)
        self._refuse_leftovers()
        self._check_ports()
        if not cfg.fencing:
            log.warning("stack.fencing_disabled", flags=["railproxy", "worker"])
            self._progress(FENCING_OFF_WARNING)

        # The stack's CA (kept) and a fresh certificate per server, before any server starts.
        # With the etcd backend embedded, etcd's member and client certificates too.
        embedded_etcd = cfg.backend == "etcd" and not cfg.etcd_endpoints
        members = [f"m{i}" for i in range(cfg.etcd_members)] if embedded_etcd else []
        tls = (
            issue_stack_tls(self.run_dir / "tls", cfg.tls_ca_dir, etcd_members=members)
            if cfg.tls
            else None
        )
        self._tls = tls
        database_url, roles = await self._start_postgres()
        etcd = await self.stores.start_etcd(tls) if cfg.backend == "etcd" else ()
        p = cfg.ports
        web = "https" if tls else "http"
        self.addresses = Addresses(
            database_url=database_url,
            etcd_endpoints=etcd,
            temporal_address=f"127.0.0.1:{p.temporal}",
            ui_url=f"http://127.0.0.1:{p.temporal_ui}",
            lock_url=f"{web}://127.0.0.1:{p.lock}",
            railstub_url=f"{web}://127.0.0.1:{p.railstub}",
            railproxy_url=f"{web}://127.0.0.1:{p.railproxy}",
            finledger_url=f"{web}://127.0.0.1:{p.finledger}",
            role_urls={v: role_url(database_url, r) for v, r in DSN_VARS.items()},
            pgpass_dir=str(roles.folder),
            tls=tls,
        )
        self._roles = roles
        # No child inherits SSL_CERT_FILE: each gets the stack's CA by its own variable
        # (stack.service_env), so a client left unconfigured fails instead of trusting by
        # accident.
        inherited_out = ("DATABASE_URL", "SSL_CERT_FILE")
        base_env = {k: v for k, v in os.environ.items() if k not in inherited_out}
        self._factory = f = ServiceFactory(self.config, self.addresses, base_env)
        launcher = self.launcher

        await launcher.launch(f.temporal())
        self._progress(f"Temporal Web UI: {self.ui_url}")
        self.stack_id = await bootstrap.mark_stack(self.database_url, self.temporal_address)
        await launcher.launch_front(f)
        if finledger_available():
            await launcher.launch(f.finledger())
        else:
            launcher.skip("finledger", "module finledger is not installed yet")
        for name in replica_names("outbox", cfg.replicas):
            port = None if cfg.replicas == 1 else free_port()
            await launcher.launch(f.outbox(name, port))
        if worker_available():
            for _ in range(cfg.workers):
                await self.start_worker()
        elif cfg.workers:
            launcher.skip("workers", "worker_main.py does not exist yet")
        if cfg.reconcile_every_s:
            self._progress(
                await bootstrap.ensure_reconcile_schedule(
                    self.temporal_address, cfg.reconcile_every_s, cfg.task_queue
                )
            )
        self._up = True
        self._write_state(stopped=False)
        log.info("stack.up", processes=sorted(self.processes), env_file=str(self.env_file))

    async def _start_postgres(self) -> tuple[str, RoleFiles]:
        url = await self.stores.start_postgres(self._tls)
        roles = generate_role_files(self.run_dir / "db-roles")
        try:
            applied = await migrate(url, passwords=roles.passwords)
        except (OSError, Exception) as exc:  # asyncpg raises many types; name the step
            raise StackError(f"migrating {safe_url(url)} failed: {exc}") from exc
        log.info("stack.migrated", applied=applied)
        self._write_state(stopped=False)
        return url, roles

    @property
    def env_file(self) -> Path:
        """RUN/stack.env: every address a runbook needs (stack.envfile); present while up."""
        return self.run_dir / ENV_FILE_NAME

    async def wait_for_rail_history(self) -> float:
        """Wait until the rail stub's records begin earlier than the proxy's clock-skew margin
        (stack.bootstrap.wait_for_rail_history: the absence rule's margin); seconds waited."""
        return await bootstrap.wait_for_rail_history(
            railstub_url=self.railstub_url,
            operator_headers=self.operator_headers(),
            verify=self.client_verify(),
            railproxy_env=self.config.service_env.get("railproxy", {}),
            progress=self._progress,
        )

    async def stop(self) -> None:
        """Stop every child (workers first, PostgreSQL last); never leaves one running.

        A cancellation (a second Ctrl-C, a caller's timeout) does not cut the stop short: it is
        re-raised once every child is gone.
        """
        task = asyncio.ensure_future(self._stop())
        cancelled = False
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done() and task.cancelled():
                    raise
                cancelled = True
        task.result()
        if cancelled:
            raise asyncio.CancelledError

    async def _stop(self) -> None:
        await self.launcher.stop_all()
        errors = await self.stores.stop()
        self._up = False
        if self.run_dir.exists():
            self._write_state(stopped=True)
        if errors:
            raise StackError("; ".join(errors))

    # ------------------------------------------------------------------ workers and chaos

    async def start_worker(
        self, name: str | None = None, env_overrides: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        """Start one more worker and wait for its /health; returns its handle."""
        if self._factory is None:
            raise StackError("the stack is not started")
        return await self.launcher.start_worker(self._factory, name, env_overrides or {})

    async def stop_worker(self, name: str) -> int | None:
        """Stop a worker gracefully (SIGTERM, then SIGKILL); returns its exit code."""
        return await self.launcher.stop_worker(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a process (its whole group): SIGSTOP/SIGCONT pause, SIGKILL crashes."""
        if name == "postgres":
            self.stores.kill_postgres(sig)
        elif name == "etcd":
            self.stores.kill_etcd(sig)
        else:
            self.launcher.signal(name, sig)
        log.info("stack.signal_sent", service=name, signal=signal.Signals(sig).name)

    @contextlib.asynccontextmanager
    async def frozen(self, name: str) -> AsyncIterator[None]:
        """`name` stopped (SIGSTOP) for the body, and continued (SIGCONT) after it, whatever
        happened in it."""
        self.kill(name, signal.SIGSTOP)
        try:
            yield
        finally:
            self.kill(name, signal.SIGCONT)

    async def restart(self, name: str) -> None:
        """Stop and start one service on the same port and wait until it is healthy again."""
        if name == "postgres":
            await self.stores.restart_postgres()
        elif name == "etcd":
            await self.stores.restart_etcd()
        else:
            await self.launcher.restart(name)
        log.info("stack.service_restarted", service=name)
        self._write_state(stopped=False)

    async def db_failover(self) -> dict[str, Any]:
        """SIGKILL the PostgreSQL primary and promote its standby (chaos fault db_failover).
        Clients keep the multi-host DSN and reconnect to the promoted node."""
        result = await self.stores.db_failover()
        self._write_state(stopped=False)
        return result

    # ------------------------------------------------------------------ etcd cluster (chaos)

    @property
    def etcd_member_names(self) -> list[str]:
        """Names of the embedded etcd members (empty when etcd is external or not used)."""
        return self.stores.etcd_member_names

    async def etcd_leader(self, timeout_s: float = 2.0) -> str | None:
        """The name of the member that is the raft leader right now, asked of every live member;
        None while there is no leader (an election is running) or no member answers."""
        return await self.stores.etcd_leader(self.etcd_client_tls(), timeout_s)

    async def stop_etcd_member(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one embedded etcd member (SIGKILL by default: a crash, not a clean leave)."""
        await self.stores.stop_etcd_member(name, sig)
        log.info("stack.etcd_member_stopped", member=name, signal=signal.Signals(sig).name)

    async def start_etcd_member(self, name: str) -> None:
        """Start a stopped member again on its ports and data directory (it rejoins)."""
        await self.stores.start_etcd_member(name)
        log.info("stack.etcd_member_started", member=name)

    # ------------------------------------------------------------------ internals

    def _check_ports(self) -> None:
        check_ports(self.config)

    def _refuse_leftovers(self) -> None:
        refuse_leftovers(self.run_dir)

    def _write_state(self, *, stopped: bool) -> None:
        """stack.json, and while up the env file and Prometheus configuration (stack.statefile)."""
        write_state(self, stopped=stopped, up=self._up)
