"""The environment file of a running local stack: `RUN/stack.env`, whose path `payouts up` prints.

Owns: which variables a stack exports to operators and runbooks (`stack_environment`: every
service URL, every metrics and health endpoint, Temporal, the database DSNs, the operator token
file), writing them as one shell-sourceable file (`write_env_file`: `export NAME='value'` lines,
0600, atomic rename) and reading such a file back without a shell (`read_env_file`), so that a
command can find its stack from it. Must never: write a password into the file (the DSNs carry
none; PGPASSFILE names the libpq password file), or a line a POSIX shell would run as anything
but an assignment.

    . .run/stack/stack.env            # a shell (every runbook's first step)
    read_env_file(Path(".run/stack/stack.env"))["LOCK_URL"]   # Python
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from stack.endpoints import endpoints

if TYPE_CHECKING:
    from stack.running import RunningStack

#: The file's name under the run directory.
ENV_FILE_NAME = "stack.env"

_NAME = re.compile(r"[A-Z_][A-Z0-9_]*\Z")


class EnvFileError(ValueError):
    """A line of an environment file is not `export NAME=value` (the message names it)."""


def stack_environment(stack: RunningStack) -> dict[str, str]:
    """Every variable an operator command or a runbook needs for this running stack."""
    env = {
        "PAYOUTS_RUN_DIR": str(stack.run_dir),
        "PAYOUTS_ENV_FILE": str(stack.run_dir / ENV_FILE_NAME),
        "DATABASE_URL": stack.database_url,  # the admin DSN: `payouts db migrate`, bump-epoch
        **stack.role_urls,  # each command's own role (docs/database-roles.md)
        "PGPASSFILE": str(stack.pgpass_file),  # their passwords, never in this file
        "TEMPORAL_ADDRESS": stack.temporal_address,
        "TEMPORAL_NAMESPACE": "default",
        "TEMPORAL_UI_URL": stack.ui_url,
        "LOCK_URL": stack.lock_url,
        "RAILSTUB_URL": stack.railstub_url,
        "RAILPROXY_URL": stack.railproxy_url,
        "WORKER_TASK_QUEUE": stack.config.task_queue,
        "RECONCILE_TASK_QUEUE": stack.config.task_queue,
        # Where `payouts payout create` writes its spans and `payouts payout trace` reads them
        # (the stack's processes write theirs there too: docs/tracing.md).
        "PAYOUTS_TRACE_DIR": str((stack.run_dir / "traces").resolve()),
        "RECONCILE_RAIL_ADMIN_URL": stack.railstub_url,
        "INVARIANTS_RAIL_ADMIN_URL": stack.railstub_url,
        "INVARIANTS_LOCK_URL": stack.lock_url,
        # The operator's bearer token (a file, 0600): every operator command presents it.
        "PAYOUTS_OPERATOR_TOKEN_FILE": str(stack.credentials.operator_token_file),
        # Operator commands that check the token themselves (no server in between).
        "OUTBOX_CREDENTIALS_PATH": str(stack.credentials.servers["outbox-cli"]),
        "LOCK_CREDENTIALS_PATH": str(stack.credentials.servers["lock-server"]),
    }
    if stack.finledger_url:
        env["FINLEDGER_URL"] = stack.finledger_url
    if stack.tls_ca_file is not None:
        # The servers answer https only (issue 27): every operator command verifies them
        # against the stack's CA, by its own variable and, for httpx's default, by
        # SSL_CERT_FILE (a local stack's shell talks to nothing else). Debian's curl ignores
        # SSL_CERT_FILE (it is built with its own bundle path) and reads CURL_CA_BUNDLE.
        ca = str(stack.tls_ca_file)
        env["RECONCILE_TLS_CA_FILE"] = ca
        env["SSL_CERT_FILE"] = ca
        env["CURL_CA_BUNDLE"] = ca
    # Empty with the PostgreSQL backend: a runbook tells the backends apart by it.
    env["ETCD_ENDPOINTS"] = ",".join(
        e if "://" in e else f"http://{e}" for e in stack.etcd_endpoints
    )
    if stack.etcd_endpoints:
        env["ETCDCTL_ENDPOINTS"] = env["ETCD_ENDPOINTS"]  # etcdctl reads this one
    etcd_tls = stack.etcd_client_tls()
    if etcd_tls is not None:
        # The embedded etcd takes https:// with a client certificate only: the stack's own, for
        # etcdctl and for `python -m lockservice bump-epoch --offline` (lockservice.cli).
        env["ETCDCTL_CACERT"] = env["LOCK_ETCD_CA_FILE"] = etcd_tls.ca_file
        env["ETCDCTL_CERT"] = env["LOCK_ETCD_CERT_FILE"] = str(etcd_tls.cert_file)
        env["ETCDCTL_KEY"] = env["LOCK_ETCD_KEY_FILE"] = str(etcd_tls.key_file)
    env.update(endpoint_variables(stack))
    return env


def endpoint_variables(stack: RunningStack) -> dict[str, str]:
    """The metrics and health endpoints that have no service URL of their own: the outbox
    publisher's, each worker's (/metrics and /health) and its Temporal SDK metrics, Temporal's;
    lists are space-separated (`for url in $WORKER_URLS; do ...; done`)."""
    by_job: dict[str, list[str]] = {}
    for e in endpoints(stack):
        by_job.setdefault(e.job, []).append(e.url)
    env = {}
    if "outbox" in by_job:
        env["OUTBOX_METRICS_URL"] = by_job["outbox"][0]
    if "temporal" in by_job:
        env["TEMPORAL_METRICS_URL"] = by_job["temporal"][0]
    env["WORKER_URLS"] = " ".join(by_job.get("worker", []))
    env["WORKER_SDK_METRICS_URLS"] = " ".join(by_job.get("worker-sdk", []))
    return env


def render_env_file(env: Mapping[str, str], *, header: str) -> str:
    lines = [f"# {line}" for line in header.splitlines()]
    for name, value in env.items():
        if not _NAME.match(name):
            raise EnvFileError(f"not an environment variable name: {name!r}")
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def write_env_file(path: Path, env: Mapping[str, str], *, header: str) -> None:
    """Write `env` to `path` (0600, replaced atomically: a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(render_env_file(env, header=header))
    tmp.replace(path)


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of a file `write_env_file` wrote, read without running a shell."""
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        if len(words) != 2 or words[0] != "export" or "=" not in words[1]:
            raise EnvFileError(f"{path}:{number}: not `export NAME=value`: {line!r}")
        name, value = words[1].split("=", 1)
        if not _NAME.match(name):
            raise EnvFileError(f"{path}:{number}: not a variable name: {name!r}")
        env[name] = value
    return env
