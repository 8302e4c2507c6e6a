"""`make compose-smoke`: docker-compose.yml started for real, following docs/deploy-compose.md.

Builds the images (stand-ins of the third-party ones unless `--real-images`, lab.compose.images),
starts the shipped compose file (plus deploy/compose/standins.yml with stand-ins) in depends_on
order with every healthcheck passed (lab.compose.up), then runs the doc's blocks as written
(lab.compose.doc): seed, ~100 payouts to POSTED, the reconciler and the invariant checker (exit
0), the pause experiment's first step; checks, from inside the stack (the operator tool service,
lab.compose.tlsprobe), that every server refuses a plaintext client and one trusting another CA
and answers one trusting the deployment's CA; checks that Prometheus reports `up == 1` for every
scrape job of deploy/compose/prometheus.yml (the https ones verified against that CA); kills
one worker container and sees a batch complete;
switches the lock backend to etcd as documented and checks the invariants again; and tears
everything down, leaving no container, volume or network of its project behind, also on failure
or Ctrl-C. Exit 0 only if every step held.

Why in lab/: like the game day, it drives a deployment through its own entry points and proves
it by running it; lab sits at the top of the layering (it imports no component), and mypy and
ruff cover it. It runs on the host, never in the image.

Must never: touch another project's containers (its own project name, `fenced-payouts-smoke`),
remove images (they are the cache of the next run), or print a secret.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from common.lockkey import lock_key
from lab.compose.doc import DocRunner, DocStepFailed
from lab.compose.engine import Engine, EngineError, podman_compose_binary
from lab.compose.images import build_images
from lab.compose.plan import ServicePlan, expected_targets, plan
from lab.compose.up import ServiceFailed, up_in_order, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploy-compose.md"
PROJECT = "fenced-payouts-smoke"
STANDIN_OVERRIDE = "deploy/compose/standins.yml"
PROM_CONFIG = ROOT / "deploy" / "compose" / "prometheus.yml"


class SmokeFailed(Exception):
    """A check of the run did not hold; the message says which."""


class Smoke:
    def __init__(self, args: argparse.Namespace, progress: Callable[[str], None]) -> None:
        self.args = args
        self.progress = progress
        files = ["docker-compose.yml"] + ([] if args.real_images else [STANDIN_OVERRIDE])
        self.run_dir = ROOT / args.run_dir
        self.engine = Engine(
            ROOT, PROJECT, files, self.run_dir, podman_compose_binary(ROOT / ".venv" / "bin")
        )
        merged: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        if not args.real_images:
            override = yaml.safe_load((ROOT / STANDIN_OVERRIDE).read_text())
            for name, svc in override["services"].items():
                merged["services"][name] = {**merged["services"][name], **svc}
        self.plans: dict[str, ServicePlan] = plan(merged)
        log = self.run_dir / "commands.log"
        log.write_text("")
        self.doc = DocRunner(
            engine=self.engine,
            doc=DOC.read_text(),
            progress=progress,
            build=lambda: build_images(
                self.engine, self.run_dir, progress, standins=not args.real_images
            ),
            up=lambda options, services, env: up_in_order(
                self.engine, self.plans, options, progress, services=services, env=env
            ),
            log=log,
        )

    # ------------------------------------------------------------------ steps

    def start(self) -> None:
        self.doc.run_block("start")

    def payouts(self) -> None:
        self.doc.run_block("payouts")
        self.expect_posted(self.args.payouts)

    def tls_refusals(self) -> None:
        """Inside the stack: a plaintext request to each server (the lock server among them),
        and a TLS client trusting another CA, are refused; the deployment's CA is answered.
        Every check's outcome is kept in RUN_DIR/tls-probe.json."""
        proc = self.engine.compose(
            "--env-file", "deploy/compose.env", "--profile", "tools", "run", "--rm",
            "--no-deps", "operator", "python", "-m", "lab.compose.tlsprobe", check=False,
        )  # fmt: skip
        report = _json_report(proc.stdout, "tls_probe")
        (self.run_dir / "tls-probe.json").write_text(json.dumps(report, indent=1, sort_keys=True))
        if proc.returncode != 0 or not report:
            raise SmokeFailed(
                f"tls probe exited {proc.returncode}: {report.get('failed') or proc.stdout[-800:]}"
                f"{proc.stderr[-400:]}"
            )
        results: dict[str, dict[str, str]] = report["tls_probe"]
        lock = results["lock-server"]
        self.progress(
            f"tls: {len(results)} servers refuse plaintext and another CA; lock-server plaintext "
            f"{lock['plaintext'][:60]!r}, other CA {lock['other_ca'][:60]!r}"
        )

    def pause_step_one(self) -> None:
        out = "".join(self.doc.run_block("pause-inspect"))
        if "holder_session" not in out or lock_key("acct-00000") not in out:
            raise SmokeFailed(f"lockservice inspect printed no key and holder: {out[-300:]!r}")

    def kill_a_worker(self) -> None:
        workers = self.engine.of_service("worker")
        if len(workers) < 2:
            raise SmokeFailed(f"{len(workers)} worker container(s): a takeover needs two")
        batch = self.args.payouts // 2
        self.operator(
            "payouts",
            "payout",
            "create",
            "--generate",
            str(batch),
            "--accounts",
            "10",
            "--seed",
            "2",
        )
        victim = workers[0].name
        self.progress(f"killing {victim} (SIGKILL) while {batch} payouts run")
        self.engine.podman("kill", victim)
        self.wait_posted(self.args.payouts + batch)
        # A killed container is not restarted by `restart: unless-stopped` (a kill counts as
        # stopped on purpose, as with Docker): bring the replica back, as an orchestrator would,
        # so the later steps have all three workers.
        if (
            next(c for c in self.engine.of_service("worker") if c.name == victim).status
            != "running"
        ):
            self.engine.podman("start", victim)
        wait_healthy(self.engine, self.plans, ["worker"], self.progress)

    def prometheus_up(self) -> None:
        jobs = expected_targets(yaml.safe_load(PROM_CONFIG.read_text()), self.plans)
        address = self.engine.host_port("prometheus", 9090)
        deadline = time.monotonic() + 240
        while True:
            results = _prom_query(address, "up")
            up: dict[str, list[float]] = {}
            for r in results:
                up.setdefault(r["metric"]["job"], []).append(float(r["value"][1]))
            bad = sorted(j for j, n in jobs.items() if len(up.get(j, [])) < n or min(up[j]) != 1.0)
            if not bad:
                figures = ", ".join(f"{j} {len(up[j])}" for j in sorted(jobs))
                self.progress(f"prometheus: up == 1 for every target of every job ({figures})")
                return
            if time.monotonic() > deadline:
                raise SmokeFailed(f"prometheus: jobs without up == 1 on every target: {bad} ({up})")
            time.sleep(5)

    def switch_backend(self) -> None:
        self.doc.run_block("switch-backend")
        wait_healthy(self.engine, self.plans, ["lock-server", "worker"], self.progress)
        batch = self.args.payouts // 2
        self.operator(
            "payouts",
            "payout",
            "create",
            "--generate",
            str(batch),
            "--accounts",
            "10",
            "--seed",
            "3",
            "--wait",
        )
        self.wait_posted(self.args.payouts * 2)
        self.doc.run_block("check")
        self.single_history_control()

    def single_history_control(self) -> None:
        """Negative control of the merged history, through the real job: the same `invariants`
        run with the PostgreSQL table alone must report the etcd-era writes as INV-07."""
        proc = self.engine.compose(
            "--env-file", "deploy/compose.env", "--profile", "tools", "run", "--rm",
            "--no-deps", "-e", "INVARIANTS_HISTORY=postgres", "invariants", check=False,
        )  # fmt: skip
        report = _json_report(proc.stdout, "invariants")
        inv07 = int(report.get("counts", {}).get("INV-07", 0))
        if proc.returncode != 1 or not inv07:
            raise SmokeFailed(
                f"negative control: the PostgreSQL history alone gave exit {proc.returncode}, "
                f"INV-07={inv07}; expected exit 1 and the etcd-era writes as INV-07"
            )
        self.progress(f"negative control: PostgreSQL history alone: INV-07 = {inv07}, exit 1")

    def teardown(self) -> None:
        try:
            self.doc.run_block("down")
        except (DocStepFailed, EngineError) as exc:
            self.progress(f"teardown: {exc}")
        left = self.engine.down()
        if left:
            raise SmokeFailed(f"left behind after teardown: {left}")
        self.progress("teardown: no container, volume or network of the project is left")

    # ------------------------------------------------------------------ helpers

    def operator(self, *argv: str) -> str:
        """A command of the `operator` tool service (the doc's way in)."""
        proc = self.engine.compose(
            "--env-file",
            "deploy/compose.env",
            "--profile",
            "tools",
            "run",
            "--rm",
            "--no-deps",
            "operator",
            *argv,
            check=False,
        )
        if proc.returncode != 0:
            raise SmokeFailed(
                f"operator {' '.join(argv[:3])} exited {proc.returncode}: "
                f"{(proc.stdout + proc.stderr)[-800:]}"
            )
        return proc.stdout

    def states(self) -> dict[str, int]:
        out = self.operator("payouts", "payout", "list", "--json")
        # podman-compose prints its own lines to stdout too: the command's is the JSON list.
        lines = [line for line in out.splitlines() if line.startswith("[")]
        if not lines:
            raise SmokeFailed(f"payout list --json printed no list: {out[-300:]!r}")
        rows = json.loads(lines[-1])
        counts: dict[str, int] = {}
        for r in rows:
            counts[str(r["state"])] = counts.get(str(r["state"]), 0) + 1
        return counts

    def expect_posted(self, n: int) -> None:
        counts = self.states()
        if counts.get("POSTED", 0) < n:
            raise SmokeFailed(f"expected {n} POSTED payouts, the payment database lists {counts}")
        self.progress(f"payouts: {counts}")

    def wait_posted(self, n: int, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            counts = self.states()
            if counts.get("POSTED", 0) >= n:
                self.progress(f"payouts: {counts}")
                return
            if time.monotonic() > deadline:
                raise SmokeFailed(f"{n} payouts not POSTED after {timeout_s:.0f}s: {counts}")
            self.progress(f"payouts: waiting for {n} POSTED: {counts}")
            time.sleep(10)


def _json_report(output: str, key: str) -> dict[str, Any]:
    """The command's one JSON object that has `key` (podman-compose adds lines of its own)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and key in data:
                return data
    return {}


def _prom_query(address: str, query: str) -> list[dict[str, Any]]:
    url = f"http://{address}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.load(response)
    return list(body["data"]["result"])


def run(args: argparse.Namespace) -> int:
    began = time.monotonic()

    def progress(line: str) -> None:
        sys.stderr.write(f"compose-smoke [{time.monotonic() - began:5.0f}s] {line}\n")
        sys.stderr.flush()

    smoke = Smoke(args, progress)
    left = smoke.engine.down()  # an interrupted earlier run's containers, by this project's label
    if left:
        progress(f"could not remove an earlier run's {left}")
        return 1
    steps = [
        smoke.start,
        smoke.tls_refusals,
        smoke.payouts,
        smoke.pause_step_one,
        smoke.kill_a_worker,
        smoke.prometheus_up,
        smoke.switch_backend,
    ]
    rc = 0
    try:
        for step in steps:
            at = time.monotonic()
            step()
            progress(f"step {step.__name__}: ok in {time.monotonic() - at:.0f}s")
    except (SmokeFailed, ServiceFailed, DocStepFailed, EngineError) as exc:
        progress(f"FAILED: {exc}")
        rc = 1
    except KeyboardInterrupt:
        progress("interrupted: tearing down")
        rc = 130
    finally:
        if not args.keep:
            try:
                smoke.teardown()
            except (SmokeFailed, EngineError) as exc:
                progress(f"FAILED: {exc}")
                rc = rc or 1
    total = time.monotonic() - began
    progress(f"{'OK' if rc == 0 else 'FAILED'} in {total:.0f}s")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.compose.smoke", description=__doc__)
    parser.add_argument(
        "--real-images",
        action="store_true",
        help="build only the project image; the engine pulls the real third-party images",
    )
    parser.add_argument("--payouts", type=int, default=100, help="the doc's batch size")
    parser.add_argument("--run-dir", default=".run/compose-smoke", help="logs, containers.conf")
    parser.add_argument("--keep", action="store_true", help="leave the stack up (debugging)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
