"""The stack's Temporal dev server reads its transfer queue at PAYOUTS_TEMPORAL_TRANSFER_RPS
(unit: no process is started): the default, a chosen value, and a bad value refused in one line
before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.config import DEFAULT_TEMPORAL_TRANSFER_RPS, StackConfig, StackError
from stack.service_env import Addresses
from stack.services import ServiceFactory

ADDRESSES = Addresses(
    database_url="postgresql://x/y",
    etcd_endpoints=(),
    temporal_address="127.0.0.1:1",
    ui_url="http://127.0.0.1:2",
    lock_url="http://127.0.0.1:3",
    railstub_url="http://127.0.0.1:4",
    railproxy_url="http://127.0.0.1:5",
    finledger_url="http://127.0.0.1:6",
)


def _flag(config: StackConfig) -> str:
    argv = ServiceFactory(config, ADDRESSES, {}).temporal().argv
    values = [argv[i + 1] for i, a in enumerate(argv) if a == "--dynamic-config-value"]
    (rps,) = [v for v in values if v.startswith("history.transferProcessorMaxPollRPS=")]
    return rps.split("=", 1)[1]


def test_unit_default_and_chosen_transfer_rps_reach_the_dev_server(tmp_path: Path) -> None:
    default = StackConfig.from_env({}, run_dir=tmp_path)
    assert _flag(default) == str(DEFAULT_TEMPORAL_TRANSFER_RPS)
    chosen = StackConfig.from_env({"PAYOUTS_TEMPORAL_TRANSFER_RPS": "20"}, run_dir=tmp_path)
    assert _flag(chosen) == "20"


@pytest.mark.parametrize("raw", ["fast", "0", "10001"])
def test_unit_bad_transfer_rps_is_one_clear_error(raw: str) -> None:
    with pytest.raises(StackError, match="PAYOUTS_TEMPORAL_TRANSFER_RPS") as err:
        StackConfig.from_env({"PAYOUTS_TEMPORAL_TRANSFER_RPS": raw})
    assert "\n" not in str(err.value)
