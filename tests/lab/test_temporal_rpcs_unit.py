"""lab.bench.temporal_rpcs: the dev server's counters the end-to-end benchmark charges Temporal with."""

from __future__ import annotations

import asyncio

from lab.bench.temporal_rpcs import parse, per_item, scrape, settled
from stack.embedded.shared import free_port

_PAGE = """\
# HELP service_requests service_requests counter
# TYPE service_requests counter
service_requests{namespace="default",operation="RecordActivityTaskHeartbeat",service_name="frontend"} 12
service_requests{namespace="default",operation="RecordActivityTaskHeartbeat",service_name="history"} 12
service_requests{namespace="default",operation="PollActivityTaskQueue",service_name="frontend"} 99
service_requests{namespace="temporal_system",operation="StartWorkflowExecution",service_name="frontend"} 2
visibility_persistence_requests{operation="UpsertWorkflowExecution",service_name="history",visibility_plugin_name="sqlite"} 7
persistence_requests{namespace="default",operation="UpdateWorkflowExecution",service_name="history"} 30
persistence_requests{namespace="system",operation="UpdateWorkflowExecution",service_name="matching"} 4
"""


def test_frontend_calls_visibility_and_store_writes_are_counted_polls_and_system_are_not() -> None:
    assert parse(_PAGE) == {
        "rpc.RecordActivityTaskHeartbeat": 12.0,
        "visibility.UpsertWorkflowExecution": 7.0,
        "persistence.UpdateWorkflowExecution": 34.0,
    }


def test_per_item_keeps_only_counters_that_moved() -> None:
    before = {"rpc.A": 10.0, "rpc.B": 5.0}
    after = {"rpc.A": 30.0, "rpc.B": 5.0, "rpc.C": 4.0}
    assert per_item(before, after, 4) == {"rpc.A": 5.0, "rpc.C": 1.0}


def test_an_unreachable_server_reads_as_no_calls() -> None:
    assert asyncio.run(scrape(free_port())) == {}
    assert asyncio.run(scrape(None)) == {}


def test_settled_gives_up_on_an_unreachable_server_with_no_calls() -> None:
    assert asyncio.run(settled(free_port(), every_s=0.01)) == {}
