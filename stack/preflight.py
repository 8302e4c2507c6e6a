"""Before a stack starts: every port it needs is free, and no process of an earlier stack on the
same run directory is still alive (read from the stack.json that `Stack` writes).

Owns: those two refusals, with messages that name the variable that moves a taken port, and
`safe_url` (a DSN without its password, for messages and files). Must never: start, stop or
signal a process.
"""

from __future__ import annotations

import json
from pathlib import Path

from stack.config import LeftoverProcessError, PortTakenError, StackConfig, port_in_use
from stack.process import pid_alive
from stack.services import finledger_available

_PORT_LABELS = {
    "temporal": "Temporal",
    "temporal_ui": "Temporal Web UI",
    "temporal_http": "Temporal HTTP API",
    "temporal_metrics": "Temporal metrics",
    "outbox_metrics": "outbox publisher metrics",
    "lock": "lock server",
    "railstub": "rail stub",
    "railproxy": "rail proxy",
    "finledger": "finance ledger",
    "postgres": "embedded PostgreSQL",
    "etcd": "embedded etcd",
}


def check_ports(cfg: StackConfig) -> None:
    """Name every taken port with the variable that moves it, before anything starts."""
    p = cfg.ports
    needed = ["temporal", "temporal_ui", "temporal_http", "temporal_metrics"]
    needed += ["lock", "railstub", "railproxy", "outbox_metrics"]
    if finledger_available():
        needed.append("finledger")
    if not cfg.database_url:
        needed.append("postgres")
    if cfg.backend == "etcd" and not cfg.etcd_endpoints:
        needed.append("etcd")
    # (port, what, the variable that moves it) for every service, then every worker's two.
    wanted = [(getattr(p, key), _PORT_LABELS[key], p.ENV_VARS[key]) for key in needed]
    for key, what in (
        ("worker_metrics_base", "metrics"),
        ("worker_sdk_metrics_base", "SDK metrics"),
    ):
        base = getattr(p, key)
        if base is not None:
            wanted += [
                (base + i, f"worker-{i + 1} {what}", p.ENV_VARS[key]) for i in range(cfg.workers)
            ]
    seen: dict[int, str] = {}
    problems: list[str] = []
    for port, what, var in wanted:
        if port in seen:
            problems.append(
                f"port {port} is configured for both {seen[port]} and {what}; set {var}"
            )
        elif port_in_use(port):
            problems.append(f"port {port} ({what}) is taken; set {var}")
        seen[port] = what
    if problems:
        raise PortTakenError("; ".join(problems))


def refuse_leftovers(run_dir: Path) -> None:
    """An earlier `payouts up` on this run directory that was killed may still have children."""
    state = run_dir / "stack.json"
    alive: list[str] = []
    if state.exists():
        try:
            recorded = json.loads(state.read_text()).get("processes", {})
        except ValueError:
            recorded = {}
        for name, info in recorded.items():
            pid = int(info.get("pid", 0))
            if pid > 0 and pid_alive(pid) and _cmdline_has(pid, str(info.get("cmd", ""))):
                alive.append(f"{name} pid {pid}")
    if alive:
        raise LeftoverProcessError(
            f"processes of an earlier stack in {run_dir} are still running "
            f"({', '.join(alive)}); stop them (kill -TERM -- -PID) or use another --run-dir"
        )


def _cmdline_has(pid: int, cmd: str) -> bool:
    """Guards against pid reuse: the live pid must still run the recorded program."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return bool(cmd) and cmd in cmdline


def safe_url(url: str) -> str:
    """The URL without a password, for messages and files."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
