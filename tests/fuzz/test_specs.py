"""schemathesis against every service's OpenAPI spec, with its own checks (harness.CHECKS), then
the invariant checker against the system the fuzzer hit: zero violations (issues 13 and 15).

The lock server and the rail proxy are fuzzed as the running system (real processes on one
database, grants signed and verified); the finance ledger stand-in and a rail stub of their own.
The only exclusions are harness.EXCLUSIONS (also in docs/api-conformance.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import schemathesis

from common import correlation
from invariants.checker import (
    InvariantReport,
    check_invariants,
    postgres_grant_source,
    stub_movement_source,
)
from ledger import PayoutStore
from ledger import WorkContext as LedgerContext
from lockservice.sdk import LockClient
from railproxy import RailProxyClient, SubmitContext, SubmitRequest
from railproxy.models import GrantIn
from stack.embedded.shared import free_port
from tests.credentials import OPERATOR, server_env, token
from tests.credentials import headers as credential_headers
from tests.fuzz.conftest import fresh_database
from tests.fuzz.harness import EXCLUSIONS, FuzzStats, HeadersFor, future_deadlines, fuzz
from tests.grants import grant_verifier, lock_server_env
from tests.servers import ServerThread
from tests.workflows.system import (
    System,
    create_payout,
    fund,
    running_system,
    spawn,
    stop,
    wait_for,
    wait_healthy,
)

MAX_EXAMPLES = 25  # per operation and mode: bounds the whole module to well under 90 s


@dataclass
class Fuzzed:
    system: System
    lock: FuzzStats
    proxy: FuzzStats
    refused_moved: list[str]


def _movements(stub_url: str, reference: object) -> int:
    if not isinstance(reference, str):
        return 0
    r = httpx.get(
        f"{stub_url}/admin/movements",
        params={"client_reference": reference},
        headers=credential_headers(OPERATOR),
    )
    return sum(1 for m in r.json()["movements"] if m["client_reference"] == reference)


def fuzz_proxy(system: System, headers: HeadersFor) -> tuple[FuzzStats, list[str]]:
    """The proxy's spec; records every refused submission that still moved money."""
    moved: list[str] = []

    def after(case: Any, response: Any) -> None:
        body = case.body if isinstance(case.body, dict) else {}
        refused = case.path == "/v1/submissions" and response.status_code >= 400
        if refused and _movements(system.stub_url, body.get("client_reference")):
            moved.append(f"{response.status_code} {body.get('client_reference')}")

    schema = schemathesis.openapi.from_url(f"{system.proxy_url}/openapi.json")
    stats = fuzz(
        "rail proxy",
        schema,
        headers=headers("proxy"),
        max_examples=MAX_EXAMPLES,
        prepare=future_deadlines,
        after=after,
    )
    return stats, moved


@pytest.fixture(scope="module")
def fuzzed(fuzz_system: System, fuzz_headers: HeadersFor) -> Fuzzed:
    """One fuzz run of the lock server's and the proxy's specs against the running system."""
    lock_schema = schemathesis.openapi.from_url(f"{fuzz_system.lock_url}/openapi.json")
    lock = fuzz("lock server", lock_schema, headers=fuzz_headers("lock"), max_examples=MAX_EXAMPLES)
    proxy, moved = fuzz_proxy(fuzz_system, fuzz_headers)
    return Fuzzed(fuzz_system, lock, proxy, moved)


def _assert_clean(stats: FuzzStats) -> None:
    print(stats.summary())
    assert stats.examples > 0
    assert not stats.failures, "\n".join(sorted(set(stats.failures))[:20])


def test_lock_server_spec(fuzzed: Fuzzed) -> None:
    _assert_clean(fuzzed.lock)
    assert fuzzed.lock.operations == 12  # /health and /v1/operator-assertions included


def test_rail_proxy_spec(fuzzed: Fuzzed) -> None:
    _assert_clean(fuzzed.proxy)
    assert fuzzed.proxy.operations == 4
    assert not fuzzed.refused_moved


def test_rail_stub_spec(lone_stub: ServerThread, fuzz_headers: HeadersFor) -> None:
    schema = schemathesis.openapi.from_url(f"{lone_stub.url}/openapi.json").exclude(
        path_regex="^/admin"
    )
    _assert_clean(
        fuzz("rail stub", schema, headers=fuzz_headers("stub"), max_examples=MAX_EXAMPLES)
    )


def test_finance_ledger_spec(finledger_server: ServerThread, fuzz_headers: HeadersFor) -> None:
    schema = schemathesis.openapi.from_url(f"{finledger_server.url}/openapi.json").exclude(
        path_regex="^/admin"
    )
    stats = fuzz(
        "finance ledger", schema, headers=fuzz_headers("finledger"), max_examples=MAX_EXAMPLES
    )
    _assert_clean(stats)


async def invariants(system: System) -> InvariantReport:
    """The real checker over the system's database, its rail's movements and grant history."""
    conn = await asyncpg.connect(system.database_url)
    try:
        return await check_invariants(
            conn,
            stub_movement_source(system.stub_url, token=token("invariants")),
            postgres_grant_source(system.database_url),
        )
    finally:
        await conn.close()


def violations(report: InvariantReport) -> dict[str, int]:
    return {r.invariant: r.count for r in report.results if r.count}


async def pay_once(system: System) -> tuple[str, int]:
    """One payout the way the workflow's steps make it, through the real SDK, lock server,
    payment store (verifying grants) and proxy: the fuzzed system still pays."""
    account, payout_id = f"acct-{uuid.uuid4().hex[:8]}", f"po-{uuid.uuid4().hex[:10]}"
    await fund(system.database_url, account, 100_000)
    await create_payout(system.database_url, payout_id, account, 2_500)
    pool = await asyncpg.create_pool(system.database_url, min_size=1, max_size=2)
    store = PayoutStore(pool, verifier=grant_verifier())
    ctx = LedgerContext(correlation_id=payout_id, actor="fuzz-test")
    try:
        async with (
            LockClient(system.lock_url, token=token("worker")) as locks,
            RailProxyClient(system.proxy_url, token=token("worker")) as proxy,
        ):
            with correlation.bound(payout_id):  # as the acquire activity binds it
                lease = await locks.acquire(f"payout:{account}", wait_s=5)
            grant = await lease.signed_grant()
            assert grant is not None
            await store.claim(payout_id, lease.token, ctx, grant=grant)
            await store.mark_submitted(payout_id, lease.token, ctx, grant=grant)
            result = await proxy.submit(
                SubmitRequest(
                    payout_id=payout_id,
                    account_id=account,
                    amount=2_500,
                    client_reference=payout_id,
                    token=lease.token,
                    grant=GrantIn(**grant.to_json()),
                    context=SubmitContext(
                        correlation_id=payout_id,
                        causation_id=f"cause-{payout_id}",
                        deadline_at=datetime.now(UTC) + timedelta(seconds=10),
                    ),
                )
            )
            assert str(result.outcome) == "ACKED", result
            await store.mark_acked(payout_id, lease.token, ctx, grant=grant)
            await store.post(payout_id, lease.token, ctx, grant=grant)
            with correlation.bound(payout_id):
                await locks.release(lease)
        assert (await store.get_payout(payout_id)).state == "POSTED"
        return payout_id, lease.token
    finally:
        await pool.close()


async def test_invariants_clean_after_the_fuzz_and_the_system_still_pays(fuzzed: Fuzzed) -> None:
    """After the lock server's spec (force-revoke and bump-epoch included) and the proxy's were
    fuzzed without a real grant: zero violations, nothing moved on the rail, and a real payout
    afterwards is paid once and leaves the checker at zero too."""
    system = fuzzed.system
    report = await invariants(system)
    assert violations(report) == {}, report.as_dict()
    async with httpx.AsyncClient(
        base_url=system.stub_url, timeout=10, headers=credential_headers(OPERATOR)
    ) as http:
        counts = (await http.get("/admin/movements")).json()["counts"]
    assert counts == {}, counts  # every made-up submission was refused before the rail
    payout_id, _ = await pay_once(system)
    assert len(system.movements(payout_id)) == 1
    assert violations(await invariants(system)) == {}
    await _assert_correlated(system, payout_id)


def _logged(log: Path, correlation_id: str) -> list[str]:
    """The names of the events in a process's JSON log that carry `correlation_id`."""
    names = []
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("correlation_id") == correlation_id:
            names.append(str(event.get("event")))
    return names


async def _assert_correlated(system: System, payout_id: str) -> None:
    """The payout's correlation id is in the lock server's, the proxy's and the rail stub's
    events for it: one trace across the three processes (issue 15)."""

    async def everywhere() -> bool:
        lock = _logged(system.log_dir / "lock.log", payout_id)
        return (
            {"lock.acquired", "lock.released"} <= set(lock)
            and "rail.submit" in " ".join(_logged(system.log_dir / "proxy.log", payout_id))
            and "railstub.movement" in _logged(system.log_dir / "stub.log", payout_id)
        )

    await wait_for(everywhere, timeout_s=10)


@pytest.fixture(scope="module")
def unverified_system(pg_server_url: str, run_dir: Path) -> Iterator[System]:
    """The same system with the proxy's grant verification switched off (experiment mode,
    verified against the stub's identity: the only way the proxy accepts the switch)."""
    proxy_env = {"RAILPROXY_VERIFY_GRANTS": "false", "RAILPROXY_EXPERIMENT_MODE": "true"}
    for url in fresh_database(pg_server_url, "fuzz_unverified"):
        with running_system(url, run_dir / "fuzz-unverified", env={"proxy": proxy_env}) as system:
            yield system


async def test_negative_control_without_grant_verification(
    unverified_system: System, fuzz_headers: HeadersFor
) -> None:
    """The same fuzz of the proxy with grant verification off: its made-up tokens move money for
    payouts that do not exist, and the real checker reports it (INV-02/INV-07)."""
    stats, _ = fuzz_proxy(unverified_system, fuzz_headers)
    assert stats.statuses.get(200, 0) > 0
    found = violations(await invariants(unverified_system))
    print(stats.summary(), "violations:", found)
    assert found.get("INV-07", 0) > 0, found
    assert set(found) <= {"INV-02", "INV-05", "INV-07", "INV-09"}, found


def test_exclusion_table_is_documented() -> None:
    """docs/api-conformance.md lists exactly harness.EXCLUSIONS: one place, two views."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "api-conformance.md").read_text()
    for service, what, why in EXCLUSIONS:
        assert f"| {service} | {what} | {why} |" in doc
    assert doc.count("\n| ") - doc.count("\n|---") >= len(EXCLUSIONS)


def test_lock_server_spec_on_etcd(
    etcd_endpoints: list[str], run_dir: Path, fuzz_headers: HeadersFor
) -> None:
    """The same spec run against a lock server process on the etcd backend."""
    port = free_port()
    log = run_dir / f"fuzz-lock-etcd-{port}.log"
    env = {
        "LOCK_BACKEND": "etcd",
        "LOCK_ETCD_ENDPOINTS": ",".join(etcd_endpoints),
        "LOCK_KEY_PREFIX": f"fuzz{uuid.uuid4().hex[:6]}/",
        "LOCK_PORT": str(port),
        **lock_server_env(),
        **server_env("lock-server"),
    }
    proc = spawn(["-m", "lockservice", "serve"], env, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", proc, log)
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        stats = fuzz(
            "lock server (etcd)", schema, headers=fuzz_headers("lock"), max_examples=MAX_EXAMPLES
        )
        _assert_clean(stats)
        assert stats.operations == 12
    finally:
        stop(proc)
