"""The finance ledger's book is durable and bounded (issue 26 section 3): `python -m finledger`
SIGKILLed and restarted on its book file books no posting twice, with the outbox redelivering
what it did not see acknowledged, and the outbox's outcome vocabulary (completed /
duplicate_completed / retryable_failure / conflict_blocked, docs/outbox.md) holds across the restart;
a soak of 10,000 postings through its HTTP API leaves its memory where it was.

The ledger is a real process; the publisher is the real `outbox.publisher.Publisher` on the
real payment database, driven step by step so that each phase is known:
0. account O's postings are delivered and acknowledged (`completed`);
1. with run-time faults, one batch of accounts D, F and X: D's items are booked and then the
   reply is lost (`drop_after_record`), F's and X's fail 503 (nothing booked), and one of X's
   keys already holds a record with other content (a forged write): `retryable_failure`;
2. ledger SIGKILLed: what is due is a `retryable_failure` (connection refused);
3. ledger restarted on the same book (its run-time faults gone): the publisher redelivers.
Negative control: the same run restarted on a fresh book (what the in-memory book did) books
D's postings a second time (`created`, hence `completed`) and forgets X's conflict.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from common.credentials import Kind, issue_tokens, read_token, write_credentials
from ledger import PayoutStore, WorkContext
from outbox.publisher import Publisher
from stack.embedded.shared import free_port
from tests.outbox.conftest import new_account, outbox_rows, outbox_settings, post_payout
from tests.workflows.system import spawn, wait_healthy

IDENTITIES: dict[str, Kind] = {"local-operator": "operator", "outbox": "component"}


@dataclass
class LedgerProcess:
    """`python -m finledger` on a fixed port and book file, started and SIGKILLed at will."""

    base: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.tokens = issue_tokens(self.base / "tokens", IDENTITIES)
        self.credentials = write_credentials(self.base / "finledger.json", IDENTITIES, self.tokens)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, book: Path | None) -> None:
        env = {
            "FINLEDGER_PORT": str(self.port),
            "FINLEDGER_CREDENTIALS_PATH": str(self.credentials),
        }
        if book is not None:
            env["FINLEDGER_BOOK_PATH"] = str(book)
        log = self.base / f"finledger-{self.port}.log"
        self.proc = spawn(["-m", "finledger"], env, log)
        wait_healthy(f"{self.url}/health", self.proc, log)

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed by the ledger itself."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def client(self, who: str = "local-operator") -> httpx.AsyncClient:
        token = read_token(token_file=self.tokens[who])
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )


@pytest.fixture
def ledger_process(tmp_path: Path) -> Iterator[LedgerProcess]:
    ledger = LedgerProcess(tmp_path)
    yield ledger
    ledger.stop()


Phase = Callable[[list[str]], Awaitable[bool]]


async def _pump(publisher: Publisher, done: Phase, timeout_s: float = 60) -> list[str]:
    """Deliver until `done(outcomes so far)`; returns the outcomes of every row processed."""
    outcomes: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not await done(outcomes):
        assert time.monotonic() < deadline, f"phase not done in time: {Counter(outcomes)}"
        processed = await publisher.process_once()
        outcomes += [str(o) for _, o in processed]
        if not processed:
            await asyncio.sleep(0.05)  # rows backing off: their retry is due shortly
    return outcomes


@dataclass
class Restart:
    accounts: dict[str, str]  # role (O, D, F, X) -> account id
    forged_key: str
    before: dict[str, dict[str, Any]]  # what the first life booked, by key
    phases: list[list[str]]  # outcomes per phase
    rows: list[asyncpg.Record]  # the outbox rows at the end
    after: dict[str, dict[str, Any]]  # what the second life's book holds, by key
    history: list[dict[str, Any]]  # the second life's request history


def _keys(rows: list[asyncpg.Record], account: str) -> set[str]:
    return {r["delivery_key"] for r in rows if r["delivery_key"].startswith(account)}


async def _restart_run(
    pool: asyncpg.Pool,
    store: PayoutStore,
    ctx: WorkContext,
    ledger: LedgerProcess,
    *,
    forgetful: bool,
) -> Restart:
    ledger.start(ledger.base / "book.sqlite")
    settings = outbox_settings(
        ledger.url,
        token_file=str(ledger.tokens["outbox"]),
        batch_size=100,  # every due row in one claim: each phase is one known set of sends
        max_attempts=100,  # nothing is dead-lettered while the ledger is away
        base_delay_s=0.05,
        max_delay_s=0.2,
        http_timeout_s=1.0,
    )
    publisher = Publisher(pool, settings)
    phases: list[list[str]] = []
    try:
        accounts = {"O": await new_account(store, ctx)}
        await post_payout(store, ctx, accounts["O"])
        phases.append([str(o) for _, o in await publisher.process_once()])  # O: acknowledged

        for role in "DFX":
            accounts[role] = await new_account(store, ctx)
            await post_payout(store, ctx, accounts[role])
        forged_key = await _forge_and_fault(ledger, pool, accounts)
        # One batch: D's items are booked and the whole reply is lost (drop_after_record).
        phases.append([str(o) for _, o in await publisher.process_once()])
        async with ledger.client() as op:
            before = {
                r["correlation_id"]: r for r in (await op.get("/v1/records")).json()["records"]
            }
        ledger.kill()

        async def one_tried_while_down(outcomes: list[str]) -> bool:
            return bool(outcomes)

        phases.append(await _pump(publisher, one_tried_while_down))
        ledger.start(ledger.base / ("fresh.sqlite" if forgetful else "book.sqlite"))

        async def none_pending(_: list[str]) -> bool:
            return not await outbox_rows(pool, "status = 'pending'")

        phases.append(await _pump(publisher, none_pending))
    finally:
        await publisher.aclose()
    async with ledger.client() as op:
        after = {r["correlation_id"]: r for r in (await op.get("/v1/records")).json()["records"]}
        history = (await op.get("/admin/requests")).json()["requests"]
    return Restart(accounts, forged_key, before, phases, await outbox_rows(pool), after, history)


async def _forge_and_fault(
    ledger: LedgerProcess, pool: asyncpg.Pool, accounts: dict[str, str]
) -> str:
    """A record under one of X's keys with other content; then the run-time faults (gone with
    the process): D booked then its reply dropped, F and X failing 503. Returns the forged key."""
    forged_key = sorted(_keys(await outbox_rows(pool), accounts["X"]))[0]
    forged = {
        "event_id": str(uuid.uuid4()),
        "event_type": "ledger.posted",
        "account_id": accounts["X"],
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "contract_version": "paydb.v1",
        "payload": {"forged": True},
    }
    async with ledger.client("outbox") as writer:
        assert (await writer.put(f"/v1/records/{forged_key}", json=forged)).status_code == 201
    rules = [
        {"correlation_prefix": accounts["D"], "action": "drop_after_record"},
        {"correlation_prefix": accounts["F"], "action": "fail", "status": 503},
        {"correlation_prefix": accounts["X"], "action": "fail", "status": 503},
    ]
    async with ledger.client() as op:
        (await op.put("/admin/faults", json={"rules": rules})).raise_for_status()
    return forged_key


def _answers(history: list[dict[str, Any]], key: str) -> list[str]:
    return [h["answer"] for h in history if h["correlation_id"] == key]


async def test_a_restarted_ledger_books_no_posting_twice(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext, ledger_process: LedgerProcess
) -> None:
    """SIGKILL and restart on the same book: what the first life booked is answered duplicate
    when redelivered (duplicate_completed), the forged record still conflicts
    (conflict_blocked), the rest is booked once (completed); retryable_failure in between."""
    run = await _restart_run(pool, store, ctx, ledger_process, forgetful=False)
    print(json.dumps({"phases": [Counter(p) for p in run.phases]}, sort_keys=True))
    a, rows = run.accounts, run.rows
    by_key = {r["delivery_key"]: r for r in rows}
    # The vocabulary, phase by phase: the four outcomes of docs/outbox.md, exactly.
    assert set(run.phases[0]) == {"completed"}  # O, acknowledged in the first life
    assert set(run.phases[1]) == {"retryable_failure"}  # the reply of the batch was lost
    assert set(run.phases[2]) == {"retryable_failure"}  # the ledger was down
    assert set(run.phases[3]) == {"completed", "duplicate_completed", "conflict_blocked"}
    # O: acknowledged before the restart, never sent again, still booked once.
    for key in _keys(rows, a["O"]):
        assert (by_key[key]["last_outcome"], by_key[key]["attempts"]) == ("completed", 1)
        assert run.after[key] == run.before[key]
    # D: booked in the first life, its reply lost, redelivered after the restart: answered
    # duplicate by the restarted ledger, the first booking kept, no second one.
    dropped = _keys(rows, a["D"])
    assert dropped and dropped <= set(run.before)
    assert {by_key[k]["last_outcome"] for k in dropped} == {"duplicate_completed"}
    for key in dropped:
        assert run.after[key] == run.before[key]  # the same seq, recorded_at, content
        answers = _answers(run.history, key)  # both lives: the history is in the book file
        assert answers[0] == "created_then_dropped" and "duplicate" in answers[1:], answers
        assert "created" not in answers
    # F and X: nothing booked before the restart (503); booked once after it.
    fresh = (_keys(rows, a["F"]) | _keys(rows, a["X"])) - {run.forged_key}
    assert fresh and not fresh & set(run.before)
    assert {by_key[k]["last_outcome"] for k in fresh} == {"completed"}
    # The forged record survived the restart, so X's posting under that key still conflicts.
    assert by_key[run.forged_key]["status"] == "conflict_blocked"
    assert run.after[run.forged_key]["payload"] == {"forged": True}
    # One record per key, exactly the outbox's keys.
    assert sorted(run.after) == sorted(by_key)
    assert len({r["seq"] for r in run.after.values()}) == len(run.after)


async def test_negative_control_a_forgetful_restart_books_postings_twice(
    pool: asyncpg.Pool, store: PayoutStore, ctx: WorkContext, ledger_process: LedgerProcess
) -> None:
    """The same run restarted on a fresh book (as the in-memory book did): D's postings, booked
    in the first life, are booked again (created, completed), and X's conflict is forgotten."""
    run = await _restart_run(pool, store, ctx, ledger_process, forgetful=True)
    dropped = _keys(run.rows, run.accounts["D"])
    by_key = {r["delivery_key"]: r for r in run.rows}
    assert dropped and dropped <= set(run.before)
    assert {by_key[k]["last_outcome"] for k in dropped} == {"completed"}  # booked twice
    assert all(_answers(run.history, k) == ["created"] for k in dropped)
    assert by_key[run.forged_key]["last_outcome"] == "completed"  # the conflict is gone


@pytest.mark.slow
async def test_ten_thousand_postings_leave_the_ledgers_memory_bounded(
    ledger_process: LedgerProcess, tmp_path: Path
) -> None:
    """10,000 postings through the batch API (20 a request, as the publisher sends them): the
    durable book's RSS grows by less than its page caches (2 x CACHE_KIB). Negative control,
    same run: a ledger without a book file holds its records in memory and grows with them."""
    from finledger.book import CACHE_KIB

    figures: dict[str, dict[str, float]] = {}
    for mode, book in (("durable", tmp_path / "soak.sqlite"), ("in_memory", None)):
        ledger_process.start(book)
        async with ledger_process.client("outbox") as writer:
            await _post(writer, 0, 1_000)  # warm up: imports, caches, allocator arenas
            before = ledger_process.rss_mib()
            await _post(writer, 1_000, 10_000)
            after = ledger_process.rss_mib()
        async with ledger_process.client() as op:
            assert (await op.get("/v1/count")).json()["count"] == 11_000
        ledger_process.stop()
        figures[mode] = {
            "rss_before_mib": round(before, 1),
            "rss_after_mib": round(after, 1),
            "growth_mib": round(after - before, 2),
        }
    bound = 2 * CACHE_KIB / 1024
    print(json.dumps({"bench": "finledger_soak", "postings": 10_000, "bound_mib": bound} | figures))
    assert figures["durable"]["growth_mib"] < bound
    # The control: the measurement sees growth where the records are held in memory.
    assert figures["in_memory"]["growth_mib"] > figures["durable"]["growth_mib"] + 2


async def _post(writer: httpx.AsyncClient, first: int, n: int, per_request: int = 20) -> None:
    for start in range(first, first + n, per_request):
        items = [
            {
                "correlation_id": f"soak-{i % 97}:po-{i}:g-{i}",
                "event_id": str(uuid.uuid4()),
                "event_type": "ledger.posted",
                "account_id": f"soak-{i % 97}",
                "occurred_at": "2026-01-01T00:00:00+00:00",
                "contract_version": "paydb.v1",
                "payload": {"amount": 1000 + i, "entries": [{"debit": i}, {"credit": i}]},
            }
            for i in range(start, min(start + per_request, first + n))
        ]
        r = await writer.post("/v1/records:batch", json={"records": items})
        assert r.status_code == 200, r.text
