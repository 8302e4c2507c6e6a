"""The stack gives the rail stub a durable movement log and the finance ledger a durable book
under its run directory (unit: no process is started), so `payouts up`, the demo and chaos
restarts keep the rail's evidence and the ledger's bookings."""

from __future__ import annotations

from pathlib import Path

from stack.config import StackConfig
from stack.service_env import Addresses
from stack.services import ServiceFactory


def _addresses() -> Addresses:
    return Addresses(
        database_url="postgresql://x/y",
        etcd_endpoints=(),
        temporal_address="127.0.0.1:1",
        ui_url="http://127.0.0.1:2",
        lock_url="http://127.0.0.1:3",
        railstub_url="http://127.0.0.1:4",
        railproxy_url="http://127.0.0.1:5",
        finledger_url="http://127.0.0.1:6",
    )


def test_unit_stub_movement_log_lives_in_the_run_directory(tmp_path: Path) -> None:
    stub = ServiceFactory(StackConfig(run_dir=tmp_path), _addresses(), {}).railstub()
    assert stub.env["RAILSTUB_MOVEMENTS_PATH"] == str(tmp_path / "railstub-movements.sqlite")


def test_unit_finance_ledger_book_lives_in_the_run_directory(tmp_path: Path) -> None:
    ledger = ServiceFactory(StackConfig(run_dir=tmp_path), _addresses(), {}).finledger()
    assert ledger.env["FINLEDGER_BOOK_PATH"] == str(tmp_path / "finledger-book.sqlite")
