"""The compose smoke run's pure logic (`make compose-smoke`, lab/compose/smoke.py): which service
may start next, how long its healthcheck may take, the full names of the images the compose file
names, and the commands of docs/deploy-compose.md.

Owns: reading docker-compose.yml's `depends_on`, `healthcheck`, `profiles` and `deploy.replicas`
into a start order, and reading the doc's marked command blocks into argument lists.
Must never: run anything (lab.compose.engine does), or hold a command of its own in place of the
doc's: a block the doc no longer has is an error, so the doc cannot drift from the run.

Why a start order of our own: Docker Compose waits for `service_healthy` itself; podman-compose
ignores it on podman < 4.6 (Debian bookworm has 4.3, which also runs no healthcheck by itself:
it schedules them with systemd timers). The runner therefore starts each service only when every
dependency's condition holds, exactly as `depends_on` says, and runs the healthchecks itself.
"""

from __future__ import annotations

import enum
import re
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DocCommand",
    "ServicePlan",
    "State",
    "doc_block",
    "doc_commands",
    "expand",
    "expected_targets",
    "health_budget_s",
    "parse_duration",
    "plan",
    "qualified_image",
    "startable",
]

#: Floor of every wait for a service's condition: the machine is shared and often loaded.
MIN_BUDGET_S = 180.0
#: A service may take this many times its healthcheck's own allowance (loaded machine).
BUDGET_FACTOR = 3.0


class State(enum.Enum):
    WAITING = "waiting"  # not started: a dependency's condition does not hold yet
    STARTED = "started"  # started, its condition not reached yet
    HEALTHY = "healthy"  # its healthcheck passed (long-running services)
    COMPLETED = "completed"  # exited 0 (one-shot jobs)
    FAILED = "failed"


#: The state each `depends_on` condition waits for.
CONDITIONS = {
    "service_healthy": State.HEALTHY,
    "service_completed_successfully": State.COMPLETED,
    "service_started": State.STARTED,
}


@dataclass(frozen=True)
class ServicePlan:
    name: str
    needs: Mapping[str, State]  # dependency -> the state it must have reached
    one_shot: bool  # restart "no": done when it exited 0
    has_healthcheck: bool
    budget_s: float  # how long it may take to reach its state once started
    replicas: int = 1


def parse_duration(text: str | int | float) -> float:
    """A Compose duration ("1m30s", "5s", "500ms", or a number of seconds) in seconds."""
    if isinstance(text, int | float):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Compose duration: {text!r}")
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    return sum(float(n) * unit[u] for n, u in parts)


def health_budget_s(healthcheck: Mapping[str, Any] | None) -> float:
    """How long a service may take to become healthy: what its own healthcheck allows (start
    period, then every retry's interval and timeout), times BUDGET_FACTOR, at least MIN_BUDGET_S."""
    hc = dict(healthcheck or {})
    own = parse_duration(hc.get("start_period", "0s")) + int(hc.get("retries", 3)) * (
        parse_duration(hc.get("interval", "30s")) + parse_duration(hc.get("timeout", "30s"))
    )
    return max(MIN_BUDGET_S, own * BUDGET_FACTOR)


def plan(compose: Mapping[str, Any], profiles: Sequence[str] = ()) -> dict[str, ServicePlan]:
    """Every service `docker compose up` would start (no profile, or an active one)."""
    services: Mapping[str, Any] = compose["services"]
    active = set(profiles)
    out: dict[str, ServicePlan] = {}
    for name, svc in services.items():
        wanted = set(svc.get("profiles") or ())
        if wanted and not wanted & active:
            continue
        hc = svc.get("healthcheck") or {}
        enabled = bool(hc.get("test")) and not hc.get("disable")
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):  # the short syntax means service_started
            deps = {d: {"condition": "service_started"} for d in deps}
        out[name] = ServicePlan(
            name=name,
            needs={d: CONDITIONS[c.get("condition", "service_started")] for d, c in deps.items()},
            one_shot=svc.get("restart") == "no",
            has_healthcheck=enabled,
            budget_s=health_budget_s(hc if enabled else None),
            replicas=int((svc.get("deploy") or {}).get("replicas", 1)),
        )
    missing = {d for p in out.values() for d in p.needs if d not in out}
    if missing:
        raise ValueError(f"depends_on names services that will not run: {sorted(missing)}")
    return out


def _reached(have: State, want: State) -> bool:
    if want is State.STARTED:
        return have in (State.STARTED, State.HEALTHY, State.COMPLETED)
    return have is want


def startable(plans: Mapping[str, ServicePlan], states: Mapping[str, State]) -> list[str]:
    """The services not started yet whose every dependency has reached its condition."""
    return sorted(
        name
        for name, p in plans.items()
        if states.get(name, State.WAITING) is State.WAITING
        and all(_reached(states.get(d, State.WAITING), want) for d, want in p.needs.items())
    )


def reached(plan_: ServicePlan, state: State) -> bool:
    """Has a started service reached what its dependents may wait for?"""
    if plan_.one_shot:
        return state is State.COMPLETED
    if plan_.has_healthcheck:
        return state is State.HEALTHY
    return state in (State.STARTED, State.HEALTHY)


def expected_targets(
    prometheus: Mapping[str, Any], plans: Mapping[str, ServicePlan]
) -> dict[str, int]:
    """Per scrape job of a Prometheus config, how many targets it must have: one per static
    target, and for DNS discovery of a compose service, one per replica of that service."""
    out: dict[str, int] = {}
    for job in prometheus["scrape_configs"]:
        n = sum(len(c.get("targets", [])) for c in job.get("static_configs", []))
        for sd in job.get("dns_sd_configs", []):
            n += sum(plans[name].replicas if name in plans else 1 for name in sd["names"])
        out[str(job["job_name"])] = n
    return out


def qualified_image(name: str) -> str:
    """The full reference an engine stores for an image name (Docker's normalisation):
    `postgres:16` -> docker.io/library/postgres:16, `prom/prometheus:v2` -> docker.io/prom/...;
    a first component with a dot or a port, or `localhost`, is a registry and is kept."""
    first, sep, _ = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return name
    if not sep:
        return f"docker.io/library/{name}"
    return f"docker.io/{name}"


# ---------------------------------------------------------------------- the doc's commands

_MARKER = "<!-- compose-smoke: {name} -->"
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    """One command line of a doc block: leading VAR=value assignments, then the argv."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    text: str = ""  # as the doc writes it, for progress lines and errors


def doc_block(text: str, name: str) -> str:
    """The fenced code block right after `<!-- compose-smoke: NAME -->` in the doc."""
    marker = _MARKER.format(name=name)
    if text.count(marker) != 1:
        raise ValueError(f"docs/deploy-compose.md must mark exactly one block {marker!r}")
    after = text.split(marker, 1)[1].lstrip()  # the block may be indented (in a list item)
    if not after.startswith("```"):
        raise ValueError(f"{marker} is not followed by a fenced code block")
    body = after.split("\n", 1)[1]
    if "```" not in body:
        raise ValueError(f"the block after {marker} is not closed")
    return textwrap.dedent(body.split("```", 1)[0].rstrip(" "))


def doc_commands(block: str) -> list[DocCommand]:
    """The block's commands: `\\` continuations joined, comments and blank lines dropped,
    words split as a POSIX shell would (no expansion here: see `expand`)."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out: list[DocCommand] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        env: dict[str, str] = {}
        while words and _ASSIGNMENT.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        out.append(DocCommand(argv=words, env=env, text=line.strip()))
    return out


def expand(word: str, env: Mapping[str, str]) -> str:
    """`$NAME` and `${NAME}` replaced from `env`; an unknown name is an error (the doc names a
    variable the run does not have), never an empty string."""

    def one(m: re.Match[str]) -> str:
        key = m.group(1) or m.group(2)
        if key not in env:
            raise KeyError(f"the doc uses ${key}, which is not set")
        return env[key]

    return _VAR.sub(one, word)
