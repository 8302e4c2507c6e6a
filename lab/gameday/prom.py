"""A real Prometheus for the game day: the shipped configuration, its process, its alerts API.

Owns: loading ops/prometheus/prometheus.yml as shipped and filling in this stack's addresses with
the same renderer compose and Kubernetes use (stack.promconfig: file-based discovery per shipped
job, so workers started later are scraped too), the game day's time compression (every interval
of the shipped file divided by one factor; rules.yml rendered with shortened windows and `for:`;
ops/prometheus/gameday-thresholds.yml in place of thresholds.yml), starting and stopping the
`prometheus` binary, and reading /api/v1/alerts. Must never: scrape a job the shipped file does
not have (an alert whose series it does not scrape must fail the game day), change
ops/prometheus/*.yml (the rendered copies live under the run directory), download anything, or
be used outside a game day (its thresholds are seconds, not hours).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from stack import promconfig
from stack.embedded.shared import free_port
from stack.process import ManagedProcess, http_check
from stack.system import Stack

#: The repository's rules, production thresholds, and the game day's thresholds.
OPS_DIR = promconfig.OPS_DIR
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

_DURATION = re.compile(r"(\d+)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


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


def seconds(duration: str) -> float:
    """A Prometheus duration ("15s", "1m30s") in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def compress(config: Mapping[str, Any], interval_s: float) -> dict[str, Any]:
    """The game day's clock: the global scrape and evaluation interval becomes `interval_s`, and
    every job's own interval is divided by the same factor (never below `interval_s`); every
    scrape may take its whole interval, so a loaded machine's slow answer is not a target down."""
    out = dict(config)
    glob = dict(out["global"])
    factor = seconds(glob["scrape_interval"]) / interval_s
    glob.update(
        scrape_interval=f"{interval_s:g}s",
        scrape_timeout=f"{interval_s:g}s",
        evaluation_interval=f"{max(interval_s, seconds(glob['evaluation_interval']) / factor):g}s",
    )
    out["global"] = glob
    jobs = []
    for shipped_job in out["scrape_configs"]:
        job = dict(shipped_job)
        if "scrape_interval" in job:
            every = max(interval_s, round(seconds(job["scrape_interval"]) / factor))
            job["scrape_interval"] = job["scrape_timeout"] = f"{every:g}s"
        else:
            job.pop("scrape_timeout", None)
        jobs.append(job)
    out["scrape_configs"] = jobs
    return out


class GamedayPrometheus:
    """A Prometheus process scraping `stack` every second and evaluating the rendered rules."""

    def __init__(self, stack: Stack, run_dir: Path, *, for_s: float, interval_s: float) -> None:
        self.stack = stack
        self.dir = (run_dir / "prometheus").resolve()
        self.for_s = for_s
        self.interval_s = interval_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_dir = self.dir / "targets"
        self._proc: ManagedProcess | None = None
        #: Targets beside the stack's own, by shipped job: e.g. the game day's scratch
        #: reconciler, whose reconcile_* series a worker serves in production (job "worker").
        self.extra_targets: dict[str, list[str]] = {}
        self._http = httpx.AsyncClient(timeout=5.0)

    def config(self) -> dict[str, Any]:
        """ops/prometheus/prometheus.yml for this stack, its clock compressed: the only changes
        are its addresses (stack.promconfig, as for compose and Kubernetes), its intervals,
        and the rule files' (rules.yml with shortened windows, the game day's thresholds)."""
        shipped = promconfig.load()
        rendered = promconfig.render(
            shipped,
            rule_files=[str(self.dir / "rules.yml"), str(GAMEDAY_THRESHOLDS)],
            # The stack's HTTP services answer https only (stack.pki): scraped with its CA.
            jobs=promconfig.local_jobs(
                self.targets_dir,
                promconfig.job_names(shipped),
                https=promconfig.https_jobs(self.stack),
            ),
        )
        return compress(rendered, self.interval_s)

    def write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rules.yml").write_text(render_rules(RULES.read_text(), for_s=self.for_s))
        self.refresh_targets()
        path = self.dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        return path

    def refresh_targets(self) -> None:
        """Rewrite the discovery files if the stack's processes changed (a worker added, replaced
        or stopped); each is replaced atomically. Called on every alerts poll."""
        targets = promconfig.local_targets(self.stack, self.extra_targets)
        promconfig.write_local_targets(self.targets_dir, targets)

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
        self.refresh_targets()
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

    async def present(self, names: set[str]) -> set[str]:
        """Which of these series Prometheus has a sample of right now."""
        if not names:
            return set()
        selector = "|".join(sorted(names))
        rows = await self.query(f'group by (__name__) ({{__name__=~"{selector}"}})')
        return {r["metric"]["__name__"] for r in rows}

    async def metric_names(self) -> set[str]:
        r = await self._http.get(f"{self.url}/api/v1/label/__name__/values")
        r.raise_for_status()
        return set(r.json()["data"])
