"""What a running local stack writes about itself in its run directory: `stack.json` (addresses
and pids, so that a later run can detect leftovers), and while it is up the env file
(stack.envfile) and the local Prometheus configuration (stack.promconfig).

Must never: write a password into stack.json (the database URL is written without it).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from stack.envfile import stack_environment, write_env_file
from stack.preflight import safe_url
from stack.promconfig import write_local_config

if TYPE_CHECKING:
    from stack.running import RunningStack

__all__ = ["write_state"]


def write_state(stack: RunningStack, *, stopped: bool, up: bool) -> None:
    """stack.json: addresses and pids, so that a later run can detect leftovers; with `up` and
    not `stopped`, the env file and the Prometheus configuration too (removed otherwise)."""
    addrs = asdict(stack.addresses) if stack.addresses else {}
    addrs["database_url"] = safe_url(addrs.get("database_url", ""))
    procs: dict[str, Any] = {}
    for name, info in stack.processes.items():
        managed = stack.launcher.procs.get(name)
        # What /proc/PID/cmdline must contain for a live pid to still be ours.
        cmd = "\0".join(managed.argv) if managed else name
        procs[name] = {"pid": info.pid, "log": str(info.log_path), "cmd": cmd}
    body = {"stopped": stopped, "addresses": addrs, "processes": procs}
    text = json.dumps(body, indent=2, sort_keys=True, default=str)  # TLS file paths
    (stack.run_dir / "stack.json").write_text(text)
    if up and not stopped:
        header = (
            f"The local stack in {stack.run_dir} (`payouts up`), rewritten when its processes "
            f"change and removed when it stops.\nIn a shell: . {stack.env_file}"
        )
        write_env_file(stack.env_file, stack_environment(stack), header=header)
        # The shipped Prometheus configuration for this stack's ports (docs/local-stack.md).
        write_local_config(stack, stack.run_dir / "prometheus")
    else:
        stack.env_file.unlink(missing_ok=True)
