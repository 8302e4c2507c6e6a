"""One shipped Prometheus configuration; every deployment differs from it in addresses only.

ops/prometheus/prometheus.yml is the source; deploy/compose/prometheus.yml and
deploy/prometheus/kubernetes.yml are rendered from it and deploy/prometheus/targets.yml by
stack.promconfig, the same renderer the local stack and the game day use. Checked: the generated
files are in sync, each equals the shipped file once addresses are removed, every address points
at a port the deployment really serves metrics on, promtool accepts them, and the shipped file
scrapes the workers' SDK metrics (the payout-latency SLO's histogram). Negative controls: a
deployment missing a job, or setting anything but an address, is refused; an edited generated
file is reported out of date.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stack import promconfig
from stack.config import Ports

ROOT = promconfig.ROOT
PROMTOOL = shutil.which("promtool")


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc


def test_generated_files_are_in_sync_with_the_shipped_config() -> None:
    assert promconfig.main(["--check"]) == 0, "run `python -m stack.promconfig`"


def test_a_stale_generated_file_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a generated file edited by hand is out of date."""
    stale = tmp_path / "prometheus.yml"
    stale.write_text(promconfig.GENERATED["compose"].read_text() + "# edited by hand\n")
    monkeypatch.setitem(promconfig.GENERATED, "compose", stale)
    monkeypatch.setattr(promconfig, "ROOT", tmp_path)
    assert promconfig.main(["--check"]) == 1


@pytest.mark.parametrize("deployment", sorted(promconfig.GENERATED))
def test_each_deployment_differs_from_the_shipped_config_in_addresses_only(deployment: str) -> None:
    shipped = promconfig.load()
    rendered = promconfig.load(promconfig.GENERATED[deployment])
    assert promconfig.without_addresses(rendered) == promconfig.without_addresses(shipped)
    assert promconfig.job_names(rendered) == promconfig.job_names(shipped)
    assert rendered["rule_files"] and all(f.endswith(("rules.yml", "thresholds.yml"))
                                          for f in rendered["rule_files"])  # fmt: skip


def test_the_renderer_refuses_anything_but_addresses() -> None:
    """Negative control: a missing job, an unknown one, or a non-address setting."""
    shipped = promconfig.load()
    _, jobs = promconfig.deployment("compose")
    fewer = {k: v for k, v in jobs.items() if k != "worker-sdk"}
    with pytest.raises(promconfig.PromConfigError, match="missing \\['worker-sdk'\\]"):
        promconfig.render(shipped, rule_files=[], jobs=fewer)
    with pytest.raises(promconfig.PromConfigError, match="unknown \\['extra'\\]"):
        promconfig.render(shipped, rule_files=[], jobs={**jobs, "extra": {}})
    slower = {**jobs, "worker": {**jobs["worker"], "scrape_interval": "5m"}}
    with pytest.raises(promconfig.PromConfigError, match="not addresses"):
        promconfig.render(shipped, rule_files=[], jobs=slower)


def test_the_shipped_config_scrapes_what_the_slo_and_etcd_alerts_read() -> None:
    """The payout-latency SLO's histogram comes from the workers' SDK metrics (worker-sdk), the
    leader-election budget from etcd; their default local ports are the stack's own."""
    jobs = {j["job_name"]: j for j in promconfig.load()["scrape_configs"]}
    assert {"worker", "worker-sdk", "etcd", "temporal", "outbox"} <= set(jobs)
    ports = Ports()
    local = {
        "lock-server": ports.lock, "railstub": ports.railstub, "railproxy": ports.railproxy,
        "finledger": ports.finledger, "outbox": ports.outbox_metrics,
        "worker": ports.worker_metrics_base, "worker-sdk": ports.worker_sdk_metrics_base,
        "etcd": ports.etcd, "temporal": ports.temporal_metrics,
    }  # fmt: skip
    for job, port in local.items():
        assert jobs[job]["static_configs"][0]["targets"] == [f"127.0.0.1:{port}"], job


def test_compose_addresses_are_the_ports_its_services_serve() -> None:
    services = _compose()["services"]
    worker = services["worker"]["environment"]
    _, jobs = promconfig.deployment("compose")
    dns = {j: jobs[j]["dns_sd_configs"][0] for j in ("worker", "worker-sdk")}
    assert dns["worker"]["port"] == int(worker["WORKER_METRICS_PORT"])
    assert dns["worker-sdk"]["port"] == int(worker["WORKER_SDK_METRICS_PORT"])
    assert jobs["outbox"]["static_configs"][0]["targets"] == [
        f"outbox:{services['outbox']['environment']['OUTBOX_METRICS_PORT']}"
    ]
    for job, cfg in jobs.items():
        for group in cfg.get("static_configs", []):
            for target in group["targets"]:
                assert target.split(":")[0] in services, (job, target)
    # docker-compose.yml mounts the shipped rules where the rendered file names them.
    volumes = services["prometheus"]["volumes"]
    assert any(v.startswith("./ops/prometheus:/etc/prometheus/rules") for v in volumes), volumes
    assert any(v.startswith("./deploy/compose/prometheus.yml:") for v in volumes), volumes


@pytest.mark.skipif(PROMTOOL is None, reason="promtool absent: run `make prometheus`")
def test_promtool_accepts_the_shipped_and_the_compose_config() -> None:
    """The shipped file with its rule files; compose's by syntax (its rule paths are the
    container's). Debian's promtool has no Kubernetes discovery, so kubernetes.yml is checked
    by the tests above only."""
    assert PROMTOOL is not None
    shipped = subprocess.run(
        [PROMTOOL, "check", "config", "prometheus.yml"],
        cwd=promconfig.OPS_DIR, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    compose = subprocess.run(
        [PROMTOOL, "check", "config", "--syntax-only", str(promconfig.GENERATED["compose"])],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert compose.returncode == 0, compose.stdout + compose.stderr
