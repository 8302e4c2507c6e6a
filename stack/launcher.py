"""The local stack's managed processes (every one but the embedded data stores): launched in
order, each healthy before the next, then signalled, restarted and stopped by name.

Owns: the running `ManagedProcess` of each service by name, in start order; the workers' ports;
and the front of a replicated stack (N lock servers and N rail proxies behind the balancer on the
service ports). Must never: start a process whose port is taken, start a second process under a
name that runs, or leave one running after `stop_all`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping

from common.logs import get_logger
from stack.balancer import Pool, replica_names, service_of
from stack.config import PortTakenError, StackConfig, StackError, UnknownProcessError, port_in_use
from stack.embedded.shared import free_port
from stack.process import ManagedProcess, ProcessInfo
from stack.services import ServiceFactory, worker_available

__all__ = ["Launcher"]

log = get_logger("stack.system")


class Launcher:
    """The managed processes of one stack; `on_change` runs after each start, stop or restart
    (the stack rewrites its state file)."""

    def __init__(
        self,
        config: StackConfig,
        progress: Callable[[str], None],
        on_change: Callable[[], None],
    ) -> None:
        self.config = config
        self._progress = progress
        self._on_change = on_change
        #: Every running managed process by name, in start order.
        self.procs: dict[str, ManagedProcess] = {}
        self._worker_seq = 0
        #: Each worker's Temporal SDK metrics port (its own /metrics is ProcessInfo.url).
        self._sdk_ports: dict[str, int] = {}

    @property
    def workers(self) -> list[str]:
        return [n for n in self.procs if n.startswith("worker-")]

    def service_replicas(self, service: str) -> list[str]:
        """The running processes of one service (`lock-server`, `railproxy`, `outbox`): the
        service itself, or its replicas `<service>-1` .. `<service>-N`."""
        return [n for n in self.procs if service_of(n, (service,)) == service]

    def processes(self) -> dict[str, ProcessInfo]:
        """Every running managed process by name."""
        out: dict[str, ProcessInfo] = {}
        for name, p in self.procs.items():
            if p.pid is not None and p.running():
                sdk = self._sdk_ports.get(name)
                sdk_url = f"http://127.0.0.1:{sdk}" if sdk else None
                out[name] = ProcessInfo(name, p.pid, p.log_path, p.url, sdk_url)
        return out

    def get(self, name: str) -> ManagedProcess:
        try:
            return self.procs[name]
        except KeyError:
            raise UnknownProcessError(
                f"no process named {name!r}; have {sorted(self.procs)}"
            ) from None

    def skip(self, what: str, why: str) -> None:
        log.warning("stack.service_skipped", service=what, reason=why)
        self._progress(f"skipping {what}: {why}")

    async def launch(self, proc: ManagedProcess) -> None:
        self._progress(f"starting {proc.name} (log {proc.log_path})")
        proc.start()
        self.procs[proc.name] = proc
        started = time.monotonic()
        await proc.wait_healthy(self.config.health_timeout_s)
        log.info(
            "stack.service_healthy",
            service=proc.name,
            pid=proc.pid,
            seconds=round(time.monotonic() - started, 2),
        )
        self._on_change()

    async def launch_front(self, f: ServiceFactory) -> None:
        """The lock server, the rail stub and the rail proxy; with replicas, N of the lock
        server and of the proxy on ports of their own, and the balancer on the service ports."""
        n, ports = self.config.replicas, self.config.ports
        if n == 1:
            await self.launch(f.lock_server())
            await self.launch(f.railstub())
            await self.launch(f.railproxy())
            return
        locks = [(name, free_port()) for name in replica_names("lock-server", n)]
        proxies = [(name, free_port()) for name in replica_names("railproxy", n)]
        for name, port in locks:
            await self.launch(f.lock_server(name, port))
        await self.launch(f.railstub())
        for name, port in proxies:
            await self.launch(f.railproxy(name, port))
        pools = [
            Pool("lock-server", ports.lock, locks),
            Pool("railproxy", ports.railproxy, proxies),
        ]
        await self.launch(f.balancer(pools))

    # ------------------------------------------------------------------ workers

    async def start_worker(
        self, f: ServiceFactory, name: str | None, env_overrides: Mapping[str, str]
    ) -> ManagedProcess:
        """Start one more worker and wait for its /health; returns its handle."""
        if not worker_available():
            raise StackError("worker_main.py does not exist; cannot start a worker")
        self._worker_seq += 1
        name = name or f"worker-{self._worker_seq}"
        if name in self.procs:
            raise StackError(f"a process named {name} is already running")
        port = self._worker_port("worker_metrics_base", name)
        sdk_port = self._worker_port("worker_sdk_metrics_base", name)
        proc = f.worker(name, port, sdk_port, env_overrides)
        self._sdk_ports[name] = sdk_port
        await self.launch(proc)
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
        proc = self.get(name)
        code = await proc.stop(self.config.stop_grace_s)
        del self.procs[name]
        self._on_change()
        return code

    # ------------------------------------------------------------------ signals and stops

    def signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to a process's whole group."""
        self.get(name).signal_group(sig)

    async def restart(self, name: str) -> None:
        """Stop and start one process on the same port and wait until it is healthy again."""
        proc = self.get(name)
        await proc.stop(self.config.stop_grace_s)
        proc.start()
        await proc.wait_healthy(self.config.health_timeout_s)

    async def stop_all(self) -> None:
        """Stop every process, the last started first (the workers before what they call)."""
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            code = await proc.stop(self.config.stop_grace_s)
            log.info("stack.service_stopped", service=name, exit_code=code)
