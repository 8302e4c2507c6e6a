"""The Grafana dashboard loads, is provisioned by file, and every panel shows data.

No Grafana can be installed here (Debian has no package; PyPI's `grafana` is an empty name), so
the dashboard is checked against the series a real Prometheus scraped from a real stack with
the shipped configuration (ops/prometheus/prometheus.yml, its addresses filled in by
stack.promconfig, on the game day's clock): every panel's expression returns data after a few
payouts and one run of the stack's Temporal Schedule `reconcile-hourly`, or is listed in
`NO_DATA_WHEN_HEALTHY` with the reason. Negative control: a panel naming a series nobody
exports returns nothing and is reported by the same check.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
import yaml

from lab.gameday.prom import GamedayPrometheus, PrometheusMissingError, binary
from lab.gameday.rules import expr_names
from payouts.batch import PayoutSpec
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.config import StackConfig
from stack.embedded.temporal import temporal_binary
from stack.promconfig import OPS_DIR
from stack.system import Stack
from workflows.reconcile_schedule import SCHEDULE_ID

ROOT = OPS_DIR.parent.parent
DASHBOARD = ROOT / "ops" / "grafana" / "dashboards" / "payouts.json"
PROVISIONING = ROOT / "ops" / "grafana" / "provisioning-dashboards.yml"

#: Panel expressions that are empty on a healthy stack, and why.
NO_DATA_WHEN_HEALTHY = {
    "sum by (code) (rate(railproxy_rejections_total[5m]))": (
        "a labelled counter with no child until the proxy rejects something (the rail outage "
        "and fenced-out scenarios of the game day make it)"
    ),
}


def _prometheus_available() -> bool:
    try:
        binary("prometheus")
    except PrometheusMissingError:
        return False
    return True


def panel_exprs(dashboard: dict[str, object]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]  # type: ignore[attr-defined]


def test_dashboard_is_provisioned_by_file_and_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "payouts-prometheus"
    provider = yaml.safe_load(PROVISIONING.read_text())["providers"][0]
    assert provider["type"] == "file"
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for subject in ("slo", "backlog", "ambiguous", "lock service", "rail connection"):
        assert subject in titles, subject


async def _without_data(prom: GamedayPrometheus, exprs: list[str]) -> list[str]:
    return [e for e in exprs if not await prom.query(e)]


@pytest.mark.slow
@pytest.mark.skipif(not _prometheus_available(), reason="prometheus absent: run `make prometheus`")
async def test_every_panel_returns_data_from_the_shipped_config(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = panel_exprs(dashboard)
    config = StackConfig.from_env(stack_env, run_dir=stack_dir / "stack", workers=1, backend="etcd")
    async with Stack(config) as stack:
        prom = GamedayPrometheus(stack, stack_dir, for_s=3.0, interval_s=1.0)
        await prom.start()
        try:
            prefix = f"dash-{uuid.uuid4().hex[:6]}-"
            accounts = await seed_accounts(stack.database_url, 1, 1_000_000, prefix)
            specs = [PayoutSpec(f"{prefix}p{i}", accounts[0], 100) for i in range(3)]
            await create_payouts(stack.database_url, specs)
            await start_workflows(stack.temporal_address, config.task_queue, specs)
            # The stack's reconcile Schedule (as compose's), run once now: the reconciliation
            # panel shows its last run.
            trigger = await asyncio.create_subprocess_exec(
                temporal_binary(), "schedule", "trigger", "--schedule-id", SCHEDULE_ID,
                "--address", stack.temporal_address,
            )  # fmt: skip
            assert await asyncio.wait_for(trigger.wait(), 60) == 0
            deadline = time.monotonic() + 120
            empty = await _without_data(prom, exprs)
            while set(empty) - set(NO_DATA_WHEN_HEALTHY) and time.monotonic() < deadline:
                await asyncio.sleep(2.0)
                empty = await _without_data(prom, exprs)
            assert not set(empty) - set(NO_DATA_WHEN_HEALTHY), f"panels without data: {empty}"
            # Negative control: the same check reports a series nobody exports.
            bogus = "rate(payouts_made_up_total[5m])"
            assert await _without_data(prom, [bogus]) == [bogus]
            assert expr_names(bogus) == {"payouts_made_up_total"}
        finally:
            await prom.stop()
