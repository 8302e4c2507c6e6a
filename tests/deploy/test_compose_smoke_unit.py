"""Unit tests of the compose smoke run's pure logic (lab.compose.plan, lab.compose.doc): the start
order read from the shipped docker-compose.yml, healthcheck budgets, image names, and the
commands of the shipped docs/deploy-compose.md. No engine runs here (make compose-smoke does)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lab.compose.doc import read_env_file, split_subcommand
from lab.compose.images import STANDINS
from lab.compose.plan import (
    ServicePlan,
    State,
    doc_block,
    doc_commands,
    expand,
    health_budget_s,
    parse_duration,
    plan,
    qualified_image,
    reached,
    startable,
)
from lab.compose.smoke import STANDIN_OVERRIDE
from tests.deploy.conftest import ROOT, compose

DOC = (ROOT / "docs" / "deploy-compose.md").read_text()
#: The blocks lab.compose.smoke runs, in its order.
BLOCKS = ("start", "payouts", "pause-inspect", "switch-backend", "check", "down")


def run_order(plans: dict[str, ServicePlan], fail: str | None = None) -> list[list[str]]:
    """Waves of services started, each dependency reaching its condition at once."""
    states = {n: State.WAITING for n in plans}
    waves = []
    while wave := startable(plans, states):
        waves.append(wave)
        for name in wave:
            p = plans[name]
            done = State.COMPLETED if p.one_shot else State.HEALTHY
            states[name] = State.FAILED if name == fail else done
    return waves


def test_the_shipped_file_starts_every_service_after_its_dependencies() -> None:
    """Every service of docker-compose.yml is started, each after its dependencies' conditions
    held (a job's exit, a service's health), and the tools profile is not started."""
    plans = plan(compose())
    waves = run_order(plans)
    started = [n for w in waves for n in w]
    assert sorted(started) == sorted(plans)
    assert not {"reconciler", "invariants", "operator"} & set(plans)
    position = {n: i for i, w in enumerate(waves) for n in w}
    for name, p in plans.items():
        assert all(position[d] < position[name] for d in p.needs), name
    assert position["migrate"] > position["postgres"] and position["worker"] == len(waves) - 1
    assert plans["worker"].replicas == 3 and plans["migrate"].one_shot


def test_negative_control_a_failed_job_starts_none_of_its_dependents() -> None:
    """migrate exits non-zero: the lock server, rail proxy, outbox and workers never start."""
    started = {n for w in run_order(plan(compose()), fail="migrate") for n in w}
    assert {"lock-server", "railproxy", "outbox", "worker"}.isdisjoint(started)
    assert {"postgres", "railstub", "temporal"} <= started


def test_the_standin_override_only_leaves_out_the_services_without_a_standin() -> None:
    services = compose()["services"]
    override = yaml.safe_load((ROOT / STANDIN_OVERRIDE).read_text())["services"]
    assert set(override) == {"temporal-ui", "grafana"}
    merged = {n: {**services[n], **override.get(n, {})} for n in services}
    assert set(plan(compose())) - set(plan({"services": merged})) == {"temporal-ui", "grafana"}


def test_every_third_party_image_has_a_standin_or_is_left_out() -> None:
    images = {svc["image"] for svc in compose()["services"].values()} - {"fenced-payouts:dev"}
    built = {t for s in STANDINS for t in s.tags}
    assert images - built == {"temporalio/ui:2.31.2", "grafana/grafana:11.3.0"}
    for s in STANDINS:
        assert (ROOT / "deploy" / "images" / s.context / "Containerfile").exists()


def test_durations_and_budgets() -> None:
    assert parse_duration("1m30s") == 90.0 and parse_duration("500ms") == 0.5
    assert parse_duration(5) == 5.0
    with pytest.raises(ValueError):
        parse_duration("5 seconds")
    hc = {"interval": "10s", "timeout": "5s", "retries": 30, "start_period": "30s"}
    assert health_budget_s(hc) == (30 + 30 * 15) * 3
    assert health_budget_s({"interval": "1s", "timeout": "1s", "retries": 1}) == 180.0


def test_reached_and_startable_follow_the_conditions() -> None:
    plans = plan(
        {
            "services": {
                "db": {"healthcheck": {"test": ["CMD", "true"]}},
                "job": {"restart": "no", "depends_on": {"db": {"condition": "service_healthy"}}},
                "app": {"depends_on": {"job": {"condition": "service_completed_successfully"}}},
            }
        }
    )
    assert startable(plans, {}) == ["db"]
    assert startable(plans, {"db": State.STARTED}) == []  # started is not healthy
    assert startable(plans, {"db": State.HEALTHY}) == ["job"]
    assert not reached(plans["job"], State.STARTED) and reached(plans["job"], State.COMPLETED)
    assert reached(plans["app"], State.STARTED)  # no healthcheck: started is enough
    with pytest.raises(ValueError, match="nothing"):
        plan({"services": {"a": {"depends_on": {"nothing": {"condition": "service_started"}}}}})


def test_image_names_are_normalised_as_docker_does() -> None:
    assert qualified_image("postgres:16.4-bookworm") == "docker.io/library/postgres:16.4-bookworm"
    assert qualified_image("prom/prometheus:v2.55.1") == "docker.io/prom/prometheus:v2.55.1"
    assert qualified_image("gcr.io/etcd-development/etcd:v3.5.16").startswith("gcr.io/")
    assert qualified_image("localhost/fenced-payouts:dev") == "localhost/fenced-payouts:dev"
    assert qualified_image("localhost:5000/x:1") == "localhost:5000/x:1"


def test_the_doc_has_every_block_the_run_follows_with_runnable_lines() -> None:
    """Each marked block parses into commands the runner knows how to run."""
    for name in BLOCKS:
        commands = doc_commands(doc_block(DOC, name))
        assert commands, name
        for c in commands:
            assert not c.argv or c.argv[0] in ("make", "docker", "."), c.text
            if c.argv[:2] == ["docker", "compose"]:
                split_subcommand(c.argv[2:])  # a compose subcommand is found
    switch = doc_commands(doc_block(DOC, "switch-backend"))
    assert switch[-1].env == {"LOCK_BACKEND": "etcd"}
    assert any("bump-epoch" in c.argv for c in switch)


def test_negative_control_a_lost_or_broken_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        doc_block(DOC.replace("<!-- compose-smoke: check -->", ""), "check")
    with pytest.raises(ValueError, match="not followed"):
        doc_block("<!-- compose-smoke: x -->\ntext\n```\na\n```\n", "x")


def test_doc_commands_join_continuations_and_split_assignments() -> None:
    block = "  # a comment\n  A=1 B=two cmd --x \\\n      'y z'\n\n  C=3\n"
    a, c = doc_commands(block)
    assert a.env == {"A": "1", "B": "two"} and a.argv == ["cmd", "--x", "y z"]
    assert c.argv == [] and c.env == {"C": "3"}


def test_expand_refuses_a_variable_the_run_does_not_have() -> None:
    assert expand("payout:$ACCOUNT/${X}", {"ACCOUNT": "a1", "X": "y"}) == "payout:a1/y"
    with pytest.raises(KeyError, match="MISSING"):
        expand("$MISSING", {})


def test_compose_global_options_are_told_from_the_subcommand(tmp_path: Path) -> None:
    opts, sub, rest = split_subcommand(
        ["--env-file", "e", "--profile", "tools", "run", "--rm", "x"]
    )
    assert opts == ["--env-file", "e", "--profile", "tools"] and sub == "run" and rest[0] == "--rm"
    env = tmp_path / "compose.env"
    env.write_text("# head\nA=1\n\nB=x=y\n")
    assert read_env_file(env) == {"A": "1", "B": "x=y"}


def test_no_fixed_host_port_is_published() -> None:
    """Issue 25: 127.0.0.1:7233 taken by compose sent a local stack's payouts to it."""
    for name, svc in compose()["services"].items():
        for port in svc.get("ports") or []:
            assert str(port).startswith("127.0.0.1::"), (name, port)


def test_prometheus_must_see_every_worker_replica() -> None:
    """deploy/compose/prometheus.yml against the compose file: one target per static entry, three
    per DNS-discovered worker job (a restarted replica missing from DNS fails the check)."""
    from lab.compose.plan import expected_targets

    config = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    targets = expected_targets(config, plan(compose()))
    assert targets["worker"] == targets["worker-sdk"] == 3
    assert targets["lock-server"] == targets["temporal"] == 1
