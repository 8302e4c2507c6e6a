"""`make bench-outbox`: CPU per payout of the outbox path (issue 16).

N payouts go through UC-01 in the real PayoutStore (create, claim, submit, ack, post) on an
embedded PostgreSQL; then one publisher drains the outbox into a real finance ledger process
(`python -m finledger`, with credentials). Measured, per payout: the CPU the publisher spent
draining (this process, which does nothing else meanwhile), the finance ledger process's CPU
over the drain, and the PostgreSQL cluster's CPU (postmaster and all its children) over the
drain and over the UC-01 writes. Also: outbox rows and HTTP write requests per payout.

Figures only, nothing asserted. Prints a table and, as its last line, one JSON object:
{"n", "rounds", "batch_size", "events_per_payout", "requests_per_payout",
 "cpu_ms_per_payout": {"publisher", "finledger", "outbox_path", "postgres_drain",
 "postgres_writes"}} (medians over the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from common.logs import configure_logging
from common.migrate import migrate
from common.pgutil import create_database, drop_database
from lab.bench.cpu import process_cpu_s, tree_cpu_s
from lab.stoppable import interrupted, run_stoppable
from ledger import PayoutStore, WorkContext
from outbox.delivery import OutboxSettings
from outbox.publisher import Publisher
from stack.embedded.postgres import EmbeddedPostgres
from stack.embedded.shared import free_port

_IDENTITIES: dict[str, Kind] = {"bench-operator": "operator", "outbox": "component"}


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def _postmaster(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
        return _parent(backend)  # while the backend still exists
    finally:
        await conn.close()


async def _payouts(url: str, n: int) -> None:
    """N payouts to POSTED through the real store, 10 accounts, 10 at a time."""
    pool = await asyncpg.create_pool(url, min_size=2, max_size=12)
    store = PayoutStore(pool)
    ctx = WorkContext(correlation_id=f"bench-{uuid.uuid4().hex[:8]}", actor="bench-outbox")
    accounts = [f"bench-{uuid.uuid4().hex[:10]}" for _ in range(10)]
    try:
        for a in accounts:
            await store.create_account(a, ctx)
            await store.fund_account(a, 10**12, ctx)

        async def one(i: int) -> None:
            payout_id = f"po-{uuid.uuid4().hex[:12]}"
            await store.create_payout(payout_id, accounts[i % 10], 100, ctx)
            for step in (store.claim, store.mark_submitted, store.mark_acked, store.post):
                await step(payout_id, 1, ctx)

        for start in range(0, n, 10):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 10, n))))
    finally:
        await pool.close()


async def _round(
    *,
    server_url: str,
    ledger: tuple[str, int],
    op: dict[str, str],
    token: Path,
    n: int,
    batch: int,
) -> dict[str, float]:
    ledger_url, ledger_pid = ledger
    url = await create_database(server_url, prefix="bench_outbox")
    try:
        await migrate(url, schemas={"paydb"})
        postmaster = await _postmaster(url)
        pg0 = tree_cpu_s(postmaster)
        await _payouts(url, n)
        pg_writes = tree_cpu_s(postmaster) - pg0
        async with httpx.AsyncClient(base_url=ledger_url, headers=op, timeout=30) as http:
            (await http.post("/admin/reset")).raise_for_status()
            pool = await asyncpg.create_pool(url, min_size=2, max_size=min(batch, 10) + 2)
            conn = await asyncpg.connect(url)
            try:
                events = int(await conn.fetchval("SELECT count(*) FROM paydb.outbox"))
            finally:
                await conn.close()
            settings = OutboxSettings(
                finledger_url=ledger_url,
                token_file=str(token),
                batch_size=batch,
                publisher_id="bench-publisher",
            )
            publisher = Publisher(pool, settings)
            fl0, pg0, me0 = (
                process_cpu_s(ledger_pid),
                tree_cpu_s(postmaster),
                time.process_time(),
            )
            try:
                delivered = await publisher.drain()
            finally:
                await publisher.aclose()
                await pool.close()
            me = time.process_time() - me0
            fl, pg = process_cpu_s(ledger_pid) - fl0, tree_cpu_s(postmaster) - pg0
            history = (await http.get("/admin/requests")).json()["requests"]
            records = int((await http.get("/v1/count")).json()["count"])
        requests = len({h["batch"] for h in history if h.get("batch") is not None})
        requests += sum(1 for h in history if h.get("batch") is None)
        if delivered != events or records != events:
            raise RuntimeError(f"drained {delivered}, booked {records} of {events} rows")
        return {
            "events_per_payout": events / n,
            "requests_per_payout": requests / n,
            "publisher": 1000 * me / n,
            "finledger": 1000 * fl / n,
            "outbox_path": 1000 * (me + fl) / n,
            "postgres_drain": 1000 * pg / n,
            "postgres_writes": 1000 * pg_writes / n,
        }
    finally:
        await drop_database(server_url, url)


def _start_ledger(base: Path, creds: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m finledger` as its own process, logging at INFO like the stack runs it."""
    port = free_port()
    env = os.environ | {"FINLEDGER_PORT": str(port), "FINLEDGER_CREDENTIALS_PATH": str(creds)}
    with (base / "finledger.log").open("wb") as log:
        ledger = subprocess.Popen(
            [sys.executable, "-m", "finledger"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return ledger, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the finance ledger did not start: {base / 'finledger.log'}")


async def _main(
    pg: EmbeddedPostgres,
    ledger: subprocess.Popen[bytes],
    ledger_url: str,
    tokens: dict[str, Path],
    args: argparse.Namespace,
) -> dict[str, Any]:
    n, rounds, batch = args.n, args.rounds, args.batch_size
    op = {"Authorization": f"Bearer {read_token(token_file=tokens['bench-operator'])}"}
    results = []
    for i in range(rounds):
        r = await _round(
            server_url=pg.url,
            ledger=(ledger_url, ledger.pid),
            op=op,
            token=tokens["outbox"],
            n=n,
            batch=batch,
        )
        results.append(r)
        print(
            f"round {i + 1}/{rounds}: " + " ".join(f"{k}={v:.2f}" for k, v in r.items()),
            flush=True,
        )
    med = {k: round(statistics.median(r[k] for r in results), 2) for k in results[0]}
    return {
        "n": n,
        "rounds": rounds,
        "batch_size": batch,
        "events_per_payout": med.pop("events_per_payout"),
        "requests_per_payout": med.pop("requests_per_payout"),
        "cpu_ms_per_payout": med,
        "load_1m_after": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=300, help="payouts per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=20, help="OUTBOX_BATCH_SIZE")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-outbox-"))
    base.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user under root
    tokens = issue_tokens(base / "tokens", _IDENTITIES)
    creds = write_credentials(base / "finledger.json", _IDENTITIES, tokens)
    with (base / "publisher.log").open("w") as publisher_log:
        # The publisher logs every delivery at INFO as JSON, as `payouts outbox run` does.
        configure_logging("outbox", level="INFO", stream=publisher_log)
        pg = EmbeddedPostgres(data_dir=base / "pg", fast=True)
        pg.start()
        ledger, url = _start_ledger(base, creds)
        result = None
        try:
            result = run_stoppable(_main(pg, ledger, url, tokens, args))
        except KeyboardInterrupt:
            pass  # SIGTERM, SIGHUP or Ctrl-C: the finance ledger and PostgreSQL stop below
        finally:
            ledger.terminate()
            ledger.wait(10)
            pg.stop(mode="fast")
    if result is None:
        return interrupted()
    print(f"{'per payout':<26}{'value':>10}")
    print(f"{'outbox rows':<26}{result['events_per_payout']:>10.2f}")
    print(f"{'HTTP write requests':<26}{result['requests_per_payout']:>10.2f}")
    for k, v in result["cpu_ms_per_payout"].items():
        print(f"{'CPU ms ' + k:<26}{v:>10.2f}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
