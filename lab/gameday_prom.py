"""A real Prometheus for the game day: its configuration, its process, and its alerts API.

Owns: writing a prometheus.yml that scrapes every process of a running `Stack` (file-based
discovery, so workers started later are scraped too), rendering the repository's rules with the
game day's shortened windows, `for:` durations and thresholds (ops/prometheus/gameday-
thresholds.yml), starting and stopping the `prometheus` binary, and reading /api/v1/alerts.
Must never: change ops/prometheus/*.yml (the rendered copies live under the run directory),
download anything, or be used outside a game day (its thresholds are seconds, not hours).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from stack.embedded import free_port
from stack.process import ManagedProcess, http_check
from stack.system import Stack

#: The repository's rules, production thresholds, and the game day's thresholds.
OPS_DIR = Path(__file__).resolve().parent.parent / "ops" / "prometheus"
RULES = OPS_DIR / "rules.yml"
GAMEDAY_THRESHOLDS = OPS_DIR / "gameday-thresholds.yml"

#: Production range windows -> game-day windows (each a few scrape intervals long, so that an
#: alert resolves within seconds of recovery). Multi-window burn-rate pairs keep their ratio.
GAMEDAY_WINDOWS = {
    "5m": "10s",
    "10m": "40s",
    "30m": "20s",
    "1h": "30s",
    "6h": "60s",
    "1d": "90s",
}


class PrometheusMissingError(RuntimeError):
    """`prometheus` or `promtool` is not on PATH (`make prometheus` installs them on Debian)."""


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PrometheusMissingError(
            f"{name} not found on PATH: run `make prometheus` (Debian, as root) or install "
            "Prometheus >= 2.42 (it ships promtool)"
        )
    return path


def render_rules(text: str, *, for_s: float) -> str:
    """The rules with every range window and `offset` shortened and every `for:` set to for_s."""

    def window(match: re.Match[str]) -> str:
        return match.group(1) + GAMEDAY_WINDOWS.get(match.group(2), match.group(2)) + match.group(3)

    text = re.sub(r"(\[)(\d+[smhd])(\])", window, text)
    text = re.sub(r"(offset )(\d+[smhd])(\b)", window, text)
    return re.sub(r"(\n\s+for: )\S+", rf"\g<1>{for_s:g}s", text)


def scrape_targets(stack: Stack) -> list[dict[str, Any]]:
    """file_sd groups for every process of the stack that serves /metrics, one job each."""
    groups: list[dict[str, Any]] = []

    def add(job: str, *urls: str | None) -> None:
        hosts = [u.removeprefix("http://").rstrip("/") for u in urls if u]
        if hosts:
            groups.append({"targets": hosts, "labels": {"job": job}})

    add("lock-server", stack.lock_url)
    add("railproxy", stack.railproxy_url)
    add("railstub", stack.railstub_url)
    add("finledger", stack.finledger_url)
    procs = stack.processes
    add("outbox", procs["outbox"].url if "outbox" in procs else None)
    add("worker", *(procs[w].url for w in stack.workers))
    sdk = [stack._procs[w].env.get("WORKER_SDK_METRICS_PORT") for w in stack.workers]
    add("worker-temporal-sdk", *(f"127.0.0.1:{p}" for p in sdk if p))
    if stack.config.backend == "etcd":
        add("etcd", *stack.etcd_endpoints)
    return groups


def scrape_config(targets_file: Path, temporal_metrics_port: int | None) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = [
        {"job_name": "payouts", "file_sd_configs": [{"files": [str(targets_file)]}]}
    ]
    if temporal_metrics_port:
        # The dev server's page is ~1.7 MB: scraped less often than ours.
        jobs.append(
            {
                "job_name": "temporal",
                "scrape_interval": "10s",
                "scrape_timeout": "5s",
                "static_configs": [{"targets": [f"127.0.0.1:{temporal_metrics_port}"]}],
            }
        )
    return {"scrape_configs": jobs}


class GamedayPrometheus:
    """A Prometheus process scraping `stack` every second and evaluating the rendered rules."""

    def __init__(self, stack: Stack, run_dir: Path, *, for_s: float, interval_s: float) -> None:
        self.stack = stack
        self.dir = (run_dir / "prometheus").resolve()
        self.for_s = for_s
        self.interval_s = interval_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_file = self.dir / "targets.json"
        self._proc: ManagedProcess | None = None
        #: Targets outside the stack (job -> host:port), e.g. the game day's scratch reconciler.
        self.extra_targets: dict[str, str] = {}
        self._http = httpx.AsyncClient(timeout=5.0)

    def write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rules.yml").write_text(render_rules(RULES.read_text(), for_s=self.for_s))
        shutil.copyfile(GAMEDAY_THRESHOLDS, self.dir / "thresholds.yml")
        self.refresh_targets()
        cfg = {
            "global": {
                "scrape_interval": f"{self.interval_s:g}s",
                "scrape_timeout": f"{self.interval_s:g}s",
                "evaluation_interval": f"{self.interval_s:g}s",
            },
            "rule_files": [str(self.dir / "rules.yml"), str(self.dir / "thresholds.yml")],
            **scrape_config(self.targets_file, self.stack.config.ports.temporal_metrics),
        }
        path = self.dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def refresh_targets(self) -> None:
        """Rewrite the discovery file (after a worker was added or replaced); atomic rename."""
        tmp = self.targets_file.with_suffix(".tmp")
        groups = scrape_targets(self.stack) + [
            {"targets": [host], "labels": {"job": job}} for job, host in self.extra_targets.items()
        ]
        tmp.write_text(json.dumps(groups, indent=1))
        tmp.replace(self.targets_file)

    async def start(self) -> None:
        config = self.write_config()
        argv = [
            binary("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]
        self._proc = ManagedProcess(
            name="prometheus",
            argv=argv,
            env={"PATH": "/usr/bin:/bin"},
            log_path=self.dir / "prometheus.log",
            health=http_check(f"{self.url}/-/ready"),
            health_what=f"GET {self.url}/-/ready",
            url=self.url,
            port=self.port,
        )
        self._proc.start()
        await self._proc.wait_healthy(30.0)

    async def stop(self) -> None:
        if self._proc is not None:
            await self._proc.stop(5.0)
            self._proc = None
        await self._http.aclose()

    async def firing(self) -> dict[str, list[Mapping[str, str]]]:
        """Alert name -> label sets of its *firing* instances, from Prometheus's own API."""
        r = await self._http.get(f"{self.url}/api/v1/alerts")
        r.raise_for_status()
        out: dict[str, list[Mapping[str, str]]] = {}
        for alert in r.json()["data"]["alerts"]:
            if alert["state"] == "firing":
                out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return out

    async def query(self, expr: str) -> list[dict[str, Any]]:
        r = await self._http.get(f"{self.url}/api/v1/query", params={"query": expr})
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    async def metric_names(self) -> set[str]:
        r = await self._http.get(f"{self.url}/api/v1/label/__name__/values")
        r.raise_for_status()
        return set(r.json()["data"])
