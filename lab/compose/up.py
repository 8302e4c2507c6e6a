"""Starting docker-compose.yml in `depends_on` order and waiting on its healthchecks, on an
engine that does neither by itself (podman 4.3 with podman-compose; lab/compose/plan.py says why).

Owns: `up` for the compose smoke run: create every container with podman-compose (`up -d
--no-start`: the compose file's own volumes, secrets, limits and environment), then start each
service once its dependencies' conditions hold, running `podman healthcheck run` until it is
healthy, or for a one-shot job until it exited 0. Also `wait_healthy` for services restarted
later (a killed worker, a recreated lock server).
Must never: start a service before its `depends_on` conditions hold, or call a service healthy
that its own healthcheck has not passed. An unhealthy service is one line naming it, with the
tail of its logs (`ServiceFailed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from lab.compose.engine import Container, Engine
from lab.compose.plan import ServicePlan, State, reached, startable

__all__ = ["ServiceFailed", "up_in_order", "wait_healthy"]

POLL_S = 2.0
#: A long-running service whose container its restart policy restarted this often is failing
#: (a crash at start), not slow: no point in waiting out its budget.
MAX_RESTARTS = 5


class ServiceFailed(Exception):
    """A service did not reach its condition: the message names it, with its logs' tail."""


def _failed(engine: Engine, service: str, why: str, container: Container | None) -> ServiceFailed:
    logs = engine.logs_tail(container.name) if container is not None else "(no container)"
    indented = "\n".join(f"    {line}" for line in logs.splitlines())
    return ServiceFailed(f"service {service} {why}; last log lines:\n{indented}")


def _observe(engine: Engine, p: ServicePlan, containers: Sequence[Container]) -> State:
    """Where a started service stands now (one healthcheck run per container that needs one)."""
    if not containers:
        return State.STARTED
    if p.one_shot:
        if all(c.status == "exited" for c in containers):
            return State.COMPLETED if all(c.exit_code == 0 for c in containers) else State.FAILED
        return State.STARTED
    if not p.has_healthcheck:
        return State.STARTED
    running = [c for c in containers if c.status == "running"]
    if len(running) < len(containers):
        return State.STARTED  # restarting (restart: unless-stopped), or not yet started
    return State.HEALTHY if all(engine.healthcheck(c.name) for c in running) else State.STARTED


def _wait(
    engine: Engine,
    plans: Mapping[str, ServicePlan],
    states: dict[str, State],
    started_at: dict[str, float],
    progress: Callable[[str], None],
    *,
    start: bool,
) -> None:
    """Drive every service to its condition: start those whose dependencies hold (when `start`),
    observe the started ones, until all have reached theirs; raise ServiceFailed otherwise."""
    while True:
        if start:
            for name in startable(plans, states):
                for c in engine.of_service(name):
                    engine.podman("start", c.name)
                states[name], started_at[name] = State.STARTED, time.monotonic()
                progress(f"{name}: started")
        pending = [n for n, s in states.items() if s is State.STARTED]
        if not pending and all(reached(plans[n], s) for n, s in states.items()):
            return
        by_service: dict[str, list[Container]] = {}
        for c in engine.containers():
            by_service.setdefault(c.service, []).append(c)
        for name in pending:
            p, mine = plans[name], by_service.get(name, [])
            state = _observe(engine, p, mine)
            if state is State.FAILED:
                bad = next(c for c in mine if c.exit_code != 0)
                raise _failed(engine, name, f"exited {bad.exit_code}", bad)
            looping = [c for c in mine if c.restarts >= MAX_RESTARTS]
            if looping and state is State.STARTED:
                raise _failed(
                    engine,
                    name,
                    f"restarted {looping[0].restarts} times (exit {looping[0].exit_code})",
                    looping[0],
                )
            if state is not State.STARTED:
                states[name] = state
                progress(f"{name}: {state.value} after {time.monotonic() - started_at[name]:.0f}s")
            elif time.monotonic() - started_at[name] > p.budget_s:
                worst = next((c for c in mine if c.status != "running"), mine[0] if mine else None)
                raise _failed(
                    engine,
                    name,
                    f"not {'done' if p.one_shot else 'healthy'} after {p.budget_s:.0f}s",
                    worst,
                )
        if not start and not pending:
            return
        time.sleep(POLL_S)


def up_in_order(
    engine: Engine,
    plans: Mapping[str, ServicePlan],
    compose_args: Sequence[str],
    progress: Callable[[str], None],
    *,
    services: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> None:
    """`docker compose up -d [SERVICE...]` as Docker does it: each container started only once
    its dependencies' conditions hold. podman-compose creates (or, for a changed service and its
    running dependents, recreates) the containers; whatever is not running then is started here,
    in order. Also why podman-compose's own `up -d SERVICE` is not used: on podman 4.3 its
    `podman wait --condition=stopped` fails for good on a job that exited minutes ago ("no such
    exit code"), and it waits forever."""
    # --no-deps: no `--requires` between the containers, whose start podman would then order
    # itself (ignoring health) and which podman 4.3 resolves wrongly for exited jobs.
    engine.compose(
        *compose_args, "up", "-d", "--no-start", "--no-deps", *services, env=env, timeout_s=900
    )
    by_service: dict[str, list[Container]] = {}
    for c in engine.containers():
        by_service.setdefault(c.service, []).append(c)
    missing = sorted(set(plans) - set(by_service))
    if missing:
        raise ServiceFailed(f"podman-compose created no container for {', '.join(missing)}")
    states = {name: _current(engine, plans[name], by_service[name]) for name in plans}
    _wait(engine, plans, states, {}, progress, start=True)


def _current(engine: Engine, p: ServicePlan, containers: Sequence[Container]) -> State:
    """A service already done needs no start: a job that exited 0, or a healthy service."""
    if p.one_shot and all(c.status == "exited" and c.exit_code == 0 for c in containers):
        return State.COMPLETED
    if all(c.status == "running" for c in containers):
        state = _observe(engine, p, containers)
        return State.HEALTHY if state is State.HEALTHY else State.WAITING
    return State.WAITING


def wait_healthy(
    engine: Engine,
    plans: Mapping[str, ServicePlan],
    services: Sequence[str],
    progress: Callable[[str], None],
) -> None:
    """Wait until each already started service is healthy again (or done, for a job)."""
    states = {name: State.STARTED for name in services}
    now = time.monotonic()
    _wait(
        engine,
        {n: plans[n] for n in services},
        states,
        {n: now for n in services},
        progress,
        start=False,
    )
