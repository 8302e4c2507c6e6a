"""The whole system on one machine: `Stack`, the API behind `payouts up`, the demo and experiments.

Owns: starting PostgreSQL, etcd, the Temporal dev server, the lock server, the rail stub, the rail
proxy, the finance-ledger stand-in, the outbox publisher and N workers in order, each healthy
before the next; the addresses they answer on; and stopping every one of them. Must never:
leave a child process behind, start on a port that is already taken, or disable fencing unless
asked to (FR-29, loudly).

    async with Stack(StackConfig.from_env(workers=2)) as stack:
        stack.railproxy_url, stack.processes["worker-1"].pid
        stack.kill("worker-1", signal.SIGSTOP)      # a real stop-the-world pause
        await stack.restart("lock-server")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from common.credentials import auth_headers, read_token
from common.db_roles import DSN_VARS, RoleFiles, generate_role_files, role_url
from common.logs import get_logger
from common.migrate import migrate
from common.tls import server_context
from railproxy.settings import ProxySettings
from stack.balancer import Pool, replica_names, service_of
from stack.config import (
    PortTakenError,
    StackConfig,
    StackError,
    UnknownProcessError,
    port_in_use,
)
from stack.credentials import STACK_OPERATOR, StackCredentials, stack_credentials
from stack.embedded.etcd import EmbeddedEtcd, EtcdMember
from stack.embedded.postgres import EmbeddedPostgres, PostgresTLS
from stack.embedded.shared import EmbeddedServerError, free_port
from stack.envfile import ENV_FILE_NAME, stack_environment, write_env_file
from stack.pki import StackTLS, issue_stack_tls
from stack.preflight import check_ports, refuse_leftovers, safe_url
from stack.process import ManagedProcess, tcp_check
from stack.promconfig import write_local_config
from stack.replication import ReplicatedPostgres
from stack.services import (
    Addresses,
    ServiceFactory,
    finledger_available,
    outbox_available,
    worker_available,
)

if TYPE_CHECKING:
    from lockservice.backends.etcd_client import EtcdTLSFiles

log = get_logger("stack.system")
T = TypeVar("T")
#: The proxy setting whose value the workload waits out (see `Stack.wait_for_rail_history`).
_SKEW_MARGIN_ENV = "RAILPROXY_ABSENCE_CLOCK_SKEW_MARGIN_S"

FENCING_OFF_WARNING = (
    "WARNING: FENCING IS OFF (FR-29, experiment only). The rail proxy accepts stale tokens and "
    "repeated submissions and the workers skip their fencing checks: a paused worker CAN move "
    "money twice. Never run this against a real rail."
)


@dataclass(frozen=True)
class ProcessInfo:
    """One running process of the stack, as `Stack.processes` reports it."""

    name: str
    pid: int
    log_path: Path
    url: str | None = None
    #: A worker's Temporal SDK metrics (PayoutWorkflow's end-to-end latency histogram).
    sdk_metrics_url: str | None = None


async def _in_thread(fn: Callable[[], T]) -> T:
    """Run blocking `fn` in a thread; on cancellation, let it finish before re-raising.

    Otherwise a Ctrl-C during `pg_ctl start` would run the shutdown while the start is still
    going, and the server would come up after the stack had already stopped it.
    """
    fut = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


class Stack:
    """The local stack. Use as `async with Stack(config) as stack:`; `stop()` is idempotent."""

    def __init__(
        self, config: StackConfig | None = None, *, progress: Callable[[str], None] | None = None
    ) -> None:
        cfg = config or StackConfig.from_env()
        run_dir = cfg.run_dir.resolve()
        self.config = replace(cfg, run_dir=run_dir, ports=cfg.ports.resolved())
        self.run_dir = run_dir
        self.stack_id = ""  # drawn at start, marked in its database and Temporal (_mark_stack)
        self._progress = progress or (lambda _line: None)
        self._pg: EmbeddedPostgres | None = None
        #: The primary/standby pair when config.postgres_standby is set; _pg is its primary.
        self._ha: ReplicatedPostgres | None = None
        self._etcd: EmbeddedEtcd | None = None
        self._procs: dict[str, ManagedProcess] = {}
        self._factory: ServiceFactory | None = None
        self._creds: StackCredentials | None = None
        self._worker_seq = 0
        #: True from the end of start-up to the beginning of stop (the env file exists).
        self._up = False
        #: Each worker's Temporal SDK metrics port (its own /metrics is ProcessInfo.url).
        self._sdk_ports: dict[str, int] = {}
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
        if self._tls is None or not self._tls.has_etcd or self._etcd is None:
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
        return self._addr().finledger_url if "finledger" in self._procs else None

    @property
    def processes(self) -> dict[str, ProcessInfo]:
        """Every running process by name (PostgreSQL and etcd only when embedded)."""
        out: dict[str, ProcessInfo] = {}
        pg_pid = self._postgres_pid()
        if self._pg is not None and pg_pid is not None:
            out["postgres"] = ProcessInfo("postgres", pg_pid, self._pg.log_path, self._pg.url)
        standby_pid = self._ha.standby_pid() if self._ha is not None else None
        if self._ha is not None and standby_pid is not None:
            sb = self._ha.standby
            out["postgres-standby"] = ProcessInfo(
                "postgres-standby", standby_pid, sb.log_path, sb.url
            )
        # The TLS fronts (stack.pgtls): their own processes, whose CPU the benches charge apart.
        nodes = [("postgres", self._pg)]
        if self._ha is not None:
            nodes.append(("postgres-standby", self._ha.standby))
        for name, node in nodes:
            front = node.front_pid if node is not None else None
            if node is not None and front is not None:
                out[f"{name}-tls"] = ProcessInfo(f"{name}-tls", front, node.front_log_path)
        if self._etcd is not None:
            for i, m in enumerate(self._etcd.members):
                if m.proc is not None and m.proc.poll() is None:
                    # Member 0 keeps the name "etcd" (one-member stacks, leftover detection).
                    name = "etcd" if i == 0 else f"etcd-{m.name}"
                    out[name] = ProcessInfo(name, m.proc.pid, m.log_path, m.client_url)
        for name, p in self._procs.items():
            if p.pid is not None and p.running():
                sdk = self._sdk_ports.get(name)
                sdk_url = f"http://127.0.0.1:{sdk}" if sdk else None
                out[name] = ProcessInfo(name, p.pid, p.log_path, p.url, sdk_url)
        return out

    @property
    def workers(self) -> list[str]:
        return [n for n in self._procs if n.startswith("worker-")]

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
        etcd = await self._start_etcd() if cfg.backend == "etcd" else ()
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
        # (stack.services), so a client left unconfigured fails instead of trusting by accident.
        inherited_out = ("DATABASE_URL", "SSL_CERT_FILE")
        base_env = {k: v for k, v in os.environ.items() if k not in inherited_out}
        self._factory = f = ServiceFactory(self.config, self.addresses, base_env)

        await self._launch(f.temporal())
        self._progress(f"Temporal Web UI: {self.ui_url}")
        await self._mark_stack()
        await self._launch_front(f)
        if finledger_available():
            await self._launch(f.finledger())
        else:
            self._skip("finledger", "module finledger is not installed yet")
        if outbox_available():
            for name in replica_names("outbox", cfg.replicas):
                port = None if cfg.replicas == 1 else free_port()
                await self._launch(f.outbox(name, port))
        else:
            self._skip("outbox", "the `payouts outbox` command does not exist yet")
        if worker_available():
            for _ in range(cfg.workers):
                await self.start_worker()
        elif cfg.workers:
            self._skip("workers", "worker_main.py does not exist yet")
        if cfg.reconcile_every_s:
            await self._ensure_reconcile_schedule(cfg.reconcile_every_s)
        self._up = True
        self._write_state(stopped=False)
        log.info("stack.up", processes=sorted(self.processes), env_file=str(self.env_file))

    async def _launch_front(self, f: ServiceFactory) -> None:
        """The lock server, the rail stub and the rail proxy; with replicas, N of the lock
        server and of the proxy on ports of their own, and the balancer on the service ports."""
        n, ports = self.config.replicas, self.config.ports
        if n == 1:
            await self._launch(f.lock_server())
            await self._launch(f.railstub())
            await self._launch(f.railproxy())
            return
        locks = [(name, free_port()) for name in replica_names("lock-server", n)]
        proxies = [(name, free_port()) for name in replica_names("railproxy", n)]
        for name, port in locks:
            await self._launch(f.lock_server(name, port))
        await self._launch(f.railstub())
        for name, port in proxies:
            await self._launch(f.railproxy(name, port))
        pools = [
            Pool("lock-server", ports.lock, locks),
            Pool("railproxy", ports.railproxy, proxies),
        ]
        await self._launch(f.balancer(pools))

    def service_replicas(self, service: str) -> list[str]:
        """The running processes of one service (`lock-server`, `railproxy`, `outbox`): the
        service itself, or its replicas `<service>-1` .. `<service>-N`."""
        return [n for n in self._procs if service_of(n, (service,)) == service]

    async def _mark_stack(self) -> None:
        """One new stack id in this stack's payment schema and Temporal namespace, so that a
        command can tell that the two it reaches belong together (common.stackmark)."""
        from temporalio.client import Client

        from common.stackmark import mark_database, mark_temporal

        self.stack_id = os.urandom(6).hex()
        await mark_database(self.database_url, self.stack_id)
        await mark_temporal(await Client.connect(self.temporal_address), self.stack_id)

    async def _ensure_reconcile_schedule(self, every_s: float) -> None:
        """The Temporal Schedule `reconcile-hourly`, as compose's `reconcile-schedule` job makes
        it: scheduled reconciliation runs in this stack's workers, visible in its Web UI."""
        # Imported here: the Schedule's workflow and settings modules take ~0.5 s to import,
        # which every `payouts` command would pay (payouts.cli loads stack.cli, hence this).
        from temporalio.client import Client

        from payouts.reconcile_cli import SCHEDULE_ID, ensure_schedule
        from reconcile.reconciler import ReconcileSettings

        client = await Client.connect(self.temporal_address)
        await ensure_schedule(
            client,
            every=timedelta(seconds=every_s),
            task_queue=self.config.task_queue,
            settle_lag_s=ReconcileSettings().settle_lag_s,
        )
        self._progress(f"Temporal Schedule {SCHEDULE_ID}: ReconcileWorkflow every {every_s:g}s")

    @property
    def env_file(self) -> Path:
        """RUN/stack.env: every address a runbook needs (stack.envfile); present while up."""
        return self.run_dir / ENV_FILE_NAME

    async def wait_for_rail_history(self) -> float:
        """Wait until the rail stub's records begin earlier than the proxy's clock-skew margin.

        The absence rule (railproxy.absence) proves a payout absent only if the rail's records
        begin at least the skew margin before the attempt; the stub's log begins when the stack
        first started it. A workload started sooner would leave every lost instruction of its
        first seconds ambiguous for good, so demo and chaos wait this out (seconds waited).
        """
        margin = float(
            self.config.service_env.get("railproxy", {}).get(_SKEW_MARGIN_ENV)
            or os.environ.get(_SKEW_MARGIN_ENV)
            or ProxySettings.model_fields["absence_clock_skew_margin_s"].default
        )
        async with httpx.AsyncClient(
            base_url=self.railstub_url,
            timeout=5.0,
            headers=self.operator_headers(),
            verify=self.client_verify(),
        ) as http:
            response = await http.get("/admin/movements", params={"client_reference": "-"})
            response.raise_for_status()
            since = datetime.fromisoformat(response.json()["complete_from"])
        wait_s = (since - datetime.now(UTC)).total_seconds() + margin + 1.0
        if wait_s > 0:
            self._progress(
                f"waiting {wait_s:.0f}s until the rail's records reach back past the "
                f"{margin:.0f}s clock-skew margin of the absence rule"
            )
            await asyncio.sleep(wait_s)
        return max(0.0, wait_s)

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
        errors: list[str] = []
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            code = await proc.stop(self.config.stop_grace_s)
            log.info("stack.service_stopped", service=name, exit_code=code)
        if self._etcd is not None:
            etcd, self._etcd = self._etcd, None
            await _in_thread(etcd.stop)
        if self._ha is not None:
            ha, self._ha, self._pg = self._ha, None, None
            await _in_thread(ha.stop)
        if self._pg is not None:
            pg, self._pg = self._pg, None
            try:
                await _in_thread(lambda: pg.stop("fast"))
            except EmbeddedServerError as exc:
                errors.append(str(exc))
                with contextlib.suppress(EmbeddedServerError):
                    await _in_thread(lambda: pg.stop("immediate"))
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
        if not worker_available():
            raise StackError("worker_main.py does not exist; cannot start a worker")
        self._worker_seq += 1
        name = name or f"worker-{self._worker_seq}"
        if name in self._procs:
            raise StackError(f"a process named {name} is already running")
        port = self._worker_port("worker_metrics_base", name)
        sdk_port = self._worker_port("worker_sdk_metrics_base", name)
        proc = self._factory.worker(name, port, sdk_port, env_overrides or {})
        self._sdk_ports[name] = sdk_port
        await self._launch(proc)
        return proc

    def _worker_port(self, base_key: str, name: str) -> int:
        """The next worker's port from its base (docs/local-stack.md, "Ports"), else a free one."""
        ports = self.config.ports
        base: int | None = getattr(ports, base_key)
        if base is None:
            return free_port()
        port = base + self._worker_seq - 1
        if port_in_use(port):
            var = ports.ENV_VARS[base_key]
            what = "SDK metrics" if "sdk" in base_key else "metrics"
            raise PortTakenError(f"port {port} ({name} {what}) is taken; set {var}")
        return port

    async def stop_worker(self, name: str) -> int | None:
        """Stop a worker gracefully (SIGTERM, then SIGKILL); returns its exit code."""
        proc = self._get(name)
        code = await proc.stop(self.config.stop_grace_s)
        del self._procs[name]
        self._write_state(stopped=False)
        return code

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a process (its whole group): SIGSTOP/SIGCONT pause, SIGKILL crashes."""
        if name == "postgres":
            pid = self._postgres_pid()
            if pid is None:
                raise UnknownProcessError("postgres is not running embedded (DATABASE_URL is set)")
            os.kill(pid, sig)
        elif name == "etcd":
            member = self._etcd_member()
            if member.proc is not None:
                member.proc.send_signal(sig)
        else:
            self._get(name).signal_group(sig)
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
            pg = self._pg
            if pg is None:
                raise UnknownProcessError("postgres is external (DATABASE_URL); cannot restart")
            with contextlib.suppress(EmbeddedServerError):
                await _in_thread(lambda: pg.stop("fast"))
            await _in_thread(pg.start)
        elif name == "etcd":
            member, etcd = self._etcd_member(), self._etcd
            assert etcd is not None
            await _in_thread(lambda: etcd.stop_member(member))
            await _in_thread(lambda: etcd.start_member(member))
        else:
            proc = self._get(name)
            await proc.stop(self.config.stop_grace_s)
            proc.start()
            await proc.wait_healthy(self.config.health_timeout_s)
        log.info("stack.service_restarted", service=name)
        self._write_state(stopped=False)

    # ------------------------------------------------------------------ etcd cluster (chaos)

    @property
    def etcd_member_names(self) -> list[str]:
        """Names of the embedded etcd members (empty when etcd is external or not used)."""
        return [m.name for m in self._etcd.members] if self._etcd is not None else []

    async def etcd_leader(self, timeout_s: float = 2.0) -> str | None:
        """The name of the member that is the raft leader right now, asked of every live member;
        None while there is no leader (an election is running) or no member answers."""
        from lockservice.backends.etcd_client import etcd_client

        if self._etcd is None:
            raise UnknownProcessError("etcd is not running embedded (ETCD_ENDPOINTS or postgres)")
        for m in self._etcd.members:
            if m.proc is None or m.proc.poll() is not None:
                continue
            try:
                async with etcd_client([m.endpoint], self.etcd_client_tls()) as client:
                    status = await asyncio.wait_for(client.status(), timeout_s)
            except Exception:  # noqa: S112 - any failure means "this member cannot tell"
                continue
            if status.leader is not None:
                return str(status.leader.name)
        return None

    async def stop_etcd_member(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one embedded etcd member (SIGKILL by default: a crash, not a clean leave)."""
        member, etcd = self._named_etcd_member(name)
        await _in_thread(lambda: etcd.stop_member(member, sig))
        log.info("stack.etcd_member_stopped", member=name, signal=signal.Signals(sig).name)

    async def start_etcd_member(self, name: str) -> None:
        """Start a stopped member again on its ports and data directory (it rejoins)."""
        member, etcd = self._named_etcd_member(name)
        await _in_thread(lambda: etcd.start_member(member, self.config.health_timeout_s))
        log.info("stack.etcd_member_started", member=name)

    def _named_etcd_member(self, name: str) -> tuple[EtcdMember, EmbeddedEtcd]:
        if self._etcd is None:
            raise UnknownProcessError("etcd is not running embedded (ETCD_ENDPOINTS or postgres)")
        for m in self._etcd.members:
            if m.name == name:
                return m, self._etcd
        raise UnknownProcessError(f"no etcd member named {name!r}; have {self.etcd_member_names}")

    # ------------------------------------------------------------------ internals

    def _get(self, name: str) -> ManagedProcess:
        try:
            return self._procs[name]
        except KeyError:
            raise UnknownProcessError(
                f"no process named {name!r}; have {sorted(self._procs)}"
            ) from None

    def _etcd_member(self) -> EtcdMember:
        if self._etcd is None:
            raise UnknownProcessError("etcd is not running embedded (ETCD_ENDPOINTS or postgres)")
        return self._etcd.members[0]

    def _postgres_pid(self) -> int | None:
        if self._pg is None:
            return None
        try:
            return int((self._pg.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _skip(self, what: str, why: str) -> None:
        log.warning("stack.service_skipped", service=what, reason=why)
        self._progress(f"skipping {what}: {why}")

    async def _launch(self, proc: ManagedProcess) -> None:
        self._progress(f"starting {proc.name} (log {proc.log_path})")
        proc.start()
        self._procs[proc.name] = proc
        started = time.monotonic()
        await proc.wait_healthy(self.config.health_timeout_s)
        log.info(
            "stack.service_healthy",
            service=proc.name,
            pid=proc.pid,
            seconds=round(time.monotonic() - started, 2),
        )
        self._write_state(stopped=False)

    async def _start_postgres(self) -> tuple[str, RoleFiles]:
        cfg = self.config
        if cfg.database_url:
            self._progress("PostgreSQL: using DATABASE_URL")
        elif cfg.postgres_standby != "none":
            await self._start_replicated()
        else:
            assert cfg.ports.postgres is not None
            # pgserver's build has no SSL: with TLS on, the server listens on its Unix socket
            # only and its TLS front (stack.pgtls) on the port; every DSN says verify-full.
            pg = EmbeddedPostgres(
                data_dir=self.run_dir / "pg", port=cfg.ports.postgres, tls=self._pg_tls()
            )
            how = "behind its TLS front" if pg.tls else "plaintext"
            self._progress(
                f"starting embedded PostgreSQL on 127.0.0.1:{pg.port}, {how} (log {pg._log})"
            )
            self._pg = pg
            try:
                await _in_thread(lambda: pg.start(timeout=cfg.health_timeout_s))
            except EmbeddedServerError as exc:
                raise StackError(f"embedded PostgreSQL failed: {exc}") from exc
        url = cfg.database_url or (self._ha.url if self._ha else self._pg.url if self._pg else "")
        roles = generate_role_files(self.run_dir / "db-roles")
        try:
            applied = await migrate(url, passwords=roles.passwords)
        except (OSError, Exception) as exc:  # asyncpg raises many types; name the step
            raise StackError(f"migrating {safe_url(url)} failed: {exc}") from exc
        log.info("stack.migrated", applied=applied)
        self._write_state(stopped=False)
        return url, roles

    def _pg_tls(self) -> PostgresTLS | None:
        return self._tls.postgres() if self._tls else None

    async def _start_replicated(self) -> None:
        cfg = self.config
        assert cfg.ports.postgres is not None
        ha = ReplicatedPostgres(
            base_dir=self.run_dir / "pg-ha",
            synchronous=cfg.postgres_standby == "sync",
            tls=self._pg_tls(),
        )
        ha.primary.port = cfg.ports.postgres  # the standby takes a free port
        self._progress(
            f"starting embedded PostgreSQL on 127.0.0.1:{ha.primary.port} with a"
            f" {cfg.postgres_standby} standby on 127.0.0.1:{ha.standby.port}"
        )
        self._ha, self._pg = ha, ha.primary
        try:
            await _in_thread(lambda: ha.start(timeout=cfg.health_timeout_s))
        except EmbeddedServerError as exc:
            raise StackError(f"embedded PostgreSQL pair failed: {exc}") from exc

    async def db_failover(self) -> dict[str, Any]:
        """SIGKILL the PostgreSQL primary and promote its standby (chaos fault db_failover).
        Clients keep the multi-host DSN and reconnect to the promoted node."""
        ha = self._ha
        if ha is None:
            raise UnknownProcessError("no PostgreSQL standby in this stack (postgres_standby)")
        old = ha.primary.port
        started = time.monotonic()
        await _in_thread(ha.failover)
        self._pg = ha.primary
        took = round(time.monotonic() - started, 3)
        log.warning(
            "stack.db_failover",
            old_primary_port=old,
            new_primary_port=ha.primary.port,
            seconds=took,
        )
        self._write_state(stopped=False)
        return {"old_primary_port": old, "new_primary_port": ha.primary.port, "took_s": took}

    async def _start_etcd(self) -> tuple[str, ...]:
        cfg = self.config
        if cfg.etcd_endpoints:
            self._progress("etcd: using ETCD_ENDPOINTS")
            return cfg.etcd_endpoints
        assert cfg.ports.etcd is not None
        if cfg.etcd_members < 1:
            raise StackError(f"etcd_members must be at least 1, got {cfg.etcd_members}")
        base = self.run_dir / "etcd"
        # Member m0 keeps the configured client port (PAYOUTS_ETCD_PORT); the others take free ones.
        members = [
            EtcdMember(
                name=f"m{i}",
                data_dir=base / f"m{i}",
                client_port=cfg.ports.etcd if i == 0 else free_port(),
                tls=self._tls.etcd_member(f"m{i}") if self._tls else None,
            )
            for i in range(cfg.etcd_members)
        ]
        etcd = EmbeddedEtcd(base_dir=base, members=members)
        ports = ", ".join(str(m.client_port) for m in members)
        how = "mutual TLS" if self._tls else "plaintext"
        self._progress(
            f"starting embedded etcd ({len(members)} member(s), {how}) on 127.0.0.1:{ports}"
        )
        self._etcd = etcd
        try:
            await _in_thread(lambda: etcd.start(timeout=cfg.health_timeout_s))
        except EmbeddedServerError as exc:
            raise StackError(f"{exc}; see its logs in {base}") from exc
        for m in members:
            await _wait(tcp_check(m.client_port), cfg.health_timeout_s, f"embedded etcd {m.name}")
        return tuple(etcd.endpoints)

    def _check_ports(self) -> None:
        check_ports(self.config)

    def _refuse_leftovers(self) -> None:
        refuse_leftovers(self.run_dir)

    def _write_state(self, *, stopped: bool) -> None:
        """stack.json: addresses and pids, so that a later run can detect leftovers."""
        addrs = asdict(self.addresses) if self.addresses else {}
        addrs["database_url"] = safe_url(addrs.get("database_url", ""))
        procs: dict[str, Any] = {}
        for name, info in self.processes.items():
            managed = self._procs.get(name)
            # What /proc/PID/cmdline must contain for a live pid to still be ours.
            cmd = "\0".join(managed.argv) if managed else name
            procs[name] = {"pid": info.pid, "log": str(info.log_path), "cmd": cmd}
        body = {"stopped": stopped, "addresses": addrs, "processes": procs}
        text = json.dumps(body, indent=2, sort_keys=True, default=str)  # TLS file paths
        (self.run_dir / "stack.json").write_text(text)
        if self._up and not stopped:
            header = (
                f"The local stack in {self.run_dir} (`payouts up`), rewritten when its processes "
                f"change and removed when it stops.\nIn a shell: . {self.env_file}"
            )
            write_env_file(self.env_file, stack_environment(self), header=header)
            # The shipped Prometheus configuration for this stack's ports (docs/local-stack.md).
            write_local_config(self, self.run_dir / "prometheus")
        else:
            self.env_file.unlink(missing_ok=True)


async def _wait(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise StackError(f"{what} was not reachable within {within_s:.0f}s")
        await asyncio.sleep(0.1)
