"""The game day's scratch reconciliation world: a second database and an exporter (UC-07).

Owns: creating a SCRATCH database on the stack's PostgreSQL server (its own name, migrated with
the repository's real migrations, never the stack's payment database), planting one discrepancy
in it (a payout that claims POSTED with no attempt, no rail movement and no posting), running
the real reconciler (reconcile.reconciler.reconcile) against it, and serving, from the game-day
process, the reconciler's own `reconcile_*` collectors on /metrics for Prometheus plus the
scratch world's rail movement log (empty: in this world nothing ever reached a rail) on
/admin/movements. Why here and not the workers: the worker's ReconcileWorkflow reads the
stack's real database through its fixed DSN; pointing it at a scratch copy would need a worker
restarted with another RECONCILE_DATABASE_URL, while the one-shot `payouts reconcile run` CLI
exits before any scrape. Must never: write to the stack's database (only CREATE/DROP DATABASE
of its own scratch name, on the server's maintenance connection), register the collectors on
the default registry's /metrics of another process, or leave the scratch database behind
(`close()` drops it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from common.migrate import COMPONENTS, migrate_component
from reconcile.reconciler import (
    DISCREPANCIES,
    LAST_COMPLETED,
    RUNS,
    ReconcileReport,
    Window,
    reconcile,
    stub_movement_source,
)
from stack.embedded.shared import free_port

#: The planted payout's age: inside the reconciled window, which ends a minute before now.
PLANTED_AGE = timedelta(minutes=10)


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            body, kind = generate_latest(self.registry), CONTENT_TYPE_LATEST
        elif self.path.startswith("/admin/movements"):
            body, kind = json.dumps({"movements": []}).encode(), "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: Prometheus scrapes every second."""


class ScratchReconciler:
    """One scratch database, the reconciler run against it, and its scrape target."""

    def __init__(self, admin_dsn: str, tls: ssl.SSLContext | None = None) -> None:
        self.admin_dsn = admin_dsn
        self.name = f"gameday_scratch_{uuid.uuid4().hex[:8]}"
        self.dsn = _with_database(admin_dsn, self.name)
        self.port = free_port()
        # One more target of the shipped worker job, so served as a worker is: https with TLS on.
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        registry = CollectorRegistry(auto_describe=True)
        for collector in (DISCREPANCIES, RUNS, LAST_COMPLETED):
            registry.register(collector)
        handler = type("ScratchHandler", (_Handler,), {"registry": registry})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.planted: str | None = None

    def start(self) -> None:
        self._thread.start()

    async def create(self) -> None:
        """A fresh scratch database with every component's real migrations applied."""
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(self.dsn)
        try:
            for component in COMPONENTS:
                await migrate_component(conn, component)
        finally:
            await conn.close()

    async def plant(self) -> str:
        """A payout claiming POSTED with no attempt, no movement and no posting (scratch only)."""
        payout_id = f"gd-scratch-{uuid.uuid4().hex[:6]}"
        account = f"gd-scratch-acct-{uuid.uuid4().hex[:6]}"
        conn = await asyncpg.connect(self.dsn)
        try:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO paydb.accounts (account_id, kind) VALUES ($1, 'customer')", account
                )
                await conn.execute(
                    "INSERT INTO paydb.balances (account_id, balance) VALUES ($1, 0)", account
                )
                await conn.execute(
                    "INSERT INTO paydb.payouts (payout_id, account_id, amount, state,"
                    " client_reference, created_at, updated_at)"
                    " VALUES ($1, $2, 100, 'POSTED', $3, now() - $4::interval,"
                    " now() - $4::interval)",
                    payout_id,
                    account,
                    f"ref-{payout_id}",
                    PLANTED_AGE,
                )
        finally:
            await conn.close()
        self.planted = payout_id
        return payout_id

    def window(self) -> Window:
        now = datetime.now(UTC)
        return Window(start=now - timedelta(hours=1), end=now - timedelta(minutes=1))

    async def run(self) -> ReconcileReport:
        """The real reconciler over the scratch database and the scratch rail (no movements);
        it sets `reconcile_discrepancies` per class, which this object serves."""
        conn = await asyncpg.connect(self.dsn)
        try:
            return await reconcile(conn, stub_movement_source(self.url), self.window())
        finally:
            await conn.close()

    async def drop(self) -> None:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await admin.close()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.drop()
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which must be running
            await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()
