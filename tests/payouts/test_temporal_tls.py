"""TLS to Temporal's frontend (common.temporal_tls) on the real console script and a real dev
server (which serves plain gRPC only): asked for TLS, a command never falls back to plain, and
fails before it writes anything; a half-configured client certificate is refused before any
connection."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from temporalio.testing import WorkflowEnvironment

from payouts.cli import main
from payouts.errors import EXIT_UNAVAILABLE, EXIT_USAGE

PAYOUTS = str(Path(sys.executable).with_name("payouts"))


def _create(db: str, address: str, account: str, payout_id: str, env: dict[str, str]) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_TLS")}
    argv = ["payout", "create", "--database-url", db, "--temporal", address]
    argv += ["--task-queue", f"q-{uuid.uuid4()}", "--account", account, "--amount", "1"]
    return subprocess.run(  # the timeout is a failure detector's bound, not a timing assertion
        [PAYOUTS, *argv, "--payout-id", payout_id],
        env=clean | env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _rows(db: str, payout_id: str) -> int:
    conn = await asyncpg.connect(db)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM paydb.payouts WHERE payout_id = $1", payout_id
            )
        )
    finally:
        await conn.close()


def test_tls_asked_against_a_plain_frontend_fails_and_writes_nothing(
    db: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    address = temporal_env.client.service_client.config.target_host
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    assert main(["seed", "--database-url", db, "--prefix", prefix, "--accounts", "1"]) == 0
    account = f"{prefix}00000"
    # Control: the same command without TLS creates and starts the payout.
    plain = _create(db, address, account, f"{prefix}plain", {})
    assert plain.returncode == 0, plain.stderr
    assert asyncio.run(_rows(db, f"{prefix}plain")) == 1
    # TLS asked: the TLS handshake meets plain gRPC and fails; no fall-back, no row.
    done = _create(db, address, account, f"{prefix}tls", {"TEMPORAL_TLS": "true"})
    assert done.returncode == EXIT_UNAVAILABLE, (done.returncode, done.stderr)
    assert "over TLS, as TEMPORAL_TLS* asked" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert asyncio.run(_rows(db, f"{prefix}tls")) == 0
    # A client certificate without its key: refused before any connection or row.
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    half = _create(
        db, address, account, f"{prefix}half", {"TEMPORAL_TLS_CLIENT_CERT_PATH": str(cert)}
    )
    assert half.returncode == EXIT_USAGE, (half.returncode, half.stderr)
    assert "TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH" in half.stderr
    assert asyncio.run(_rows(db, f"{prefix}half")) == 0
