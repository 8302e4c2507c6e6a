"""The container engine of the compose smoke run: podman and podman-compose as child processes.

Owns: the engine's configuration for this machine (a containers.conf with runc and explicit
rlimits), the project's name and compose files (COMPOSE_PROJECT_NAME, COMPOSE_FILE, so that the
doc's `docker compose ...` commands run unchanged), the project's containers and their states,
`podman healthcheck run`, log tails, and the exact clean-up of what the project created.
Must never: touch a container, volume, network or image it did not create: everything it lists
or removes is selected by the project's label (`io.podman.compose.project=<project>`).

Why this configuration (docs/deploy-compose.md, "On podman"): Debian bookworm's podman 4.3 fails
with its default crun here ("cgroups in hybrid mode not supported") and works with runc; the
default rlimits above the machine's hard open-file limit (20000) are refused, so they are set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONTAINERS_CONF", "Container", "Engine", "EngineError"]

CONTAINERS_CONF = """\
# Written by lab/compose/engine.py for make compose-smoke: runc (crun fails on this kind of
# machine) and rlimits the machine grants (the defaults above 20000 open files are refused).
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""
LABEL = "io.podman.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


class EngineError(Exception):
    """An engine command failed; the message says which, with its output's tail."""


@dataclass(frozen=True)
class Container:
    name: str
    service: str
    status: str  # podman's: created, running, exited, ...
    exit_code: int
    restarts: int = 0  # by its restart policy


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class Engine:
    """podman and podman-compose for one compose project."""

    def __init__(
        self,
        root: Path,
        project: str,
        files: Sequence[str],
        run_dir: Path,
        podman_compose: str,
    ) -> None:
        self.root = root
        self.project = project
        run_dir.mkdir(parents=True, exist_ok=True)
        conf = run_dir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.podman_compose = podman_compose
        self.env = dict(os.environ)
        self.env.update(
            CONTAINERS_CONF=str(conf),
            COMPOSE_PROJECT_NAME=project,
            COMPOSE_FILE=os.pathsep.join(files),
            COMPOSE_PATH_SEPARATOR=os.pathsep,
        )

    # ------------------------------------------------------------------ running commands

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command with the engine's environment; stdout and stderr captured."""
        full = dict(self.env, **(env or {}))
        try:
            proc = subprocess.run(
                list(argv),
                cwd=self.root,
                env=full,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(
                f"{' '.join(argv[:4])} ... did not finish in {timeout_s:.0f}s"
            ) from exc
        if check and proc.returncode != 0:
            raise EngineError(
                f"{' '.join(argv[:6])} exited {proc.returncode}: "
                f"{_tail(proc.stderr or proc.stdout, 8)}"
            )
        return proc

    def podman(self, *args: str, timeout_s: float = 600.0, check: bool = True) -> str:
        return self.run(["podman", *args], timeout_s=timeout_s, check=check).stdout

    def compose(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        return self.run([self.podman_compose, *args], env=env, timeout_s=timeout_s, check=check)

    # ------------------------------------------------------------------ the project's state

    def containers(self) -> list[Container]:
        out = self.podman(
            "ps", "-a", "--filter", f"label={LABEL}={self.project}", "--format", "json"
        )
        rows = json.loads(out or "[]")
        return sorted(
            (
                Container(
                    name=r["Names"][0],
                    service=(r.get("Labels") or {}).get(SERVICE_LABEL, ""),
                    status=str(r.get("State", "")),
                    exit_code=int(r.get("ExitCode") or 0),
                    restarts=int(r.get("Restarts") or 0),
                )
                for r in rows
            ),
            key=lambda c: c.name,
        )

    def of_service(self, service: str) -> list[Container]:
        return [c for c in self.containers() if c.service == service]

    def healthcheck(self, name: str) -> bool:
        """Run the container's healthcheck once (podman 4.3 never runs it by itself)."""
        return (
            self.run(["podman", "healthcheck", "run", name], timeout_s=60, check=False).returncode
            == 0
        )

    def logs_tail(self, name: str, lines: int = 15) -> str:
        proc = self.run(["podman", "logs", "--tail", str(lines), name], timeout_s=60, check=False)
        return _tail(proc.stdout + proc.stderr, lines)

    def host_port(self, service: str, port: int) -> str:
        """host:port where a service's published port is reachable (`podman port`)."""
        containers = self.of_service(service)
        if not containers:
            raise EngineError(f"{service} has no container")
        out = self.podman("port", containers[0].name, f"{port}/tcp").strip().splitlines()
        if not out:
            raise EngineError(f"{service} publishes no port {port}")
        return out[0].replace("0.0.0.0", "127.0.0.1")  # noqa: S104 - a reply read, not a bind

    # ------------------------------------------------------------------ clean-up

    def leftovers(self) -> dict[str, list[str]]:
        """Everything of this project still there: containers, volumes, networks."""
        label = f"label={LABEL}={self.project}"
        return {
            "containers": self.podman("ps", "-aq", "--filter", label, check=False).split(),
            "volumes": self.podman("volume", "ls", "-q", "--filter", label, check=False).split(),
            "networks": self.podman(
                "network", "ls", "-q", "--filter", label, "--format", "{{.Name}}", check=False
            ).split(),
        }

    def down(self) -> dict[str, list[str]]:
        """`compose down -v` with every profile, then anything still labelled with the project
        (a `run` container, a half-created volume); returns what is left (nothing, normally)."""
        self.compose(
            "--profile", "tools", "--profile", "no-standin", "down", "-v", "-t", "10", check=False
        )
        left = self.leftovers()
        if left["containers"]:
            self.podman("rm", "-f", "-t", "5", *left["containers"], check=False)
        if left["volumes"]:
            self.podman("volume", "rm", "-f", *left["volumes"], check=False)
        if left["networks"]:
            self.podman("network", "rm", "-f", *left["networks"], check=False)
        return {k: v for k, v in self.leftovers().items() if v}


def podman_compose_binary(venv_bin: Path) -> str:
    """podman-compose from the project's venv (make compose-smoke installs it, pinned)."""
    found = shutil.which("podman-compose", path=str(venv_bin))
    if not found:
        raise EngineError("podman-compose is not installed in .venv: run make compose-smoke")
    return found
