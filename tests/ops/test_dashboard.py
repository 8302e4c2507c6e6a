"""The Grafana dashboard loads, is provisioned by file, and names only metrics that exist.

A metric "exists" if ops/prometheus/rules.yml records it or a process of the real running
stack serves it on /metrics (scraped here, not listed by hand). Negative control: a panel
naming a metric nobody exports is caught by the same check.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lab.gameday_prom import OPS_DIR, scrape_targets
from stack.config import StackConfig
from stack.system import Stack

ROOT = OPS_DIR.parent.parent
DASHBOARD = ROOT / "ops" / "grafana" / "dashboards" / "payouts.json"
PROVISIONING = ROOT / "ops" / "grafana" / "provisioning-dashboards.yml"

#: PromQL words that are not metric names.
_PROMQL = {
    "sum", "max", "min", "avg", "by", "without", "rate", "increase", "histogram_quantile",
    "time", "le", "on", "and", "or", "unless", "offset", "count", "round", "scalar", "vector",
}  # fmt: skip


def panel_metrics(dashboard: dict[str, object]) -> set[str]:
    names: set[str] = set()
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}", "", target["expr"])  # label matchers
            expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
            expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)  # grouping labels
            names |= {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)} - _PROMQL
    return names


def recorded_series() -> set[str]:
    names = set()
    for name in ("rules.yml", "thresholds.yml"):
        doc = yaml.safe_load((OPS_DIR / name).read_text())
        names |= {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    return names


def _family_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":  # a labelled counter with no child yet has no samples
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_count", "_sum")}
        names |= {s.name for s in family.samples}  # _total, _bucket, _count as scraped
    return names


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


@pytest.mark.slow
async def test_every_panel_names_a_metric_that_exists(
    stack_env: dict[str, str], stack_dir: Path
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = panel_metrics(dashboard)
    config = StackConfig.from_env(stack_env, run_dir=stack_dir, workers=1, backend="etcd")
    scraped: set[str] = set()
    async with Stack(config) as stack, httpx.AsyncClient(timeout=10) as http:
        for group in scrape_targets(stack):
            for host in group["targets"]:
                r = await http.get(f"http://{host}/metrics")
                assert r.status_code == 200, (group["labels"]["job"], host)
                scraped |= _family_names(r.text)
    scraped.add("up")  # Prometheus's own series for every target
    known = scraped | recorded_series()
    assert not wanted - known, f"panels name metrics nobody exports: {sorted(wanted - known)}"
    # Negative control: the same check catches a metric nobody exports.
    bogus = {"panels": [{"targets": [{"expr": "rate(payouts_made_up_total[5m])"}]}]}
    assert panel_metrics(bogus) - known == {"payouts_made_up_total"}
