"""The compose file's HTTP servers of ours and every string a service's settings hold, for the
compose TLS checks (test_compose_tls_*.py)."""

from __future__ import annotations

from typing import Any

#: The HTTP servers of ours and the variables that hand each its certificate (common.tls): the
#: four APIs, the workers' /metrics and /health (every replica, one certificate) and the outbox
#: publisher's /metrics (prometheus_client's certfile/keyfile).
SERVERS = {
    "lock-server": "LOCK_",
    "railstub": "RAILSTUB_",
    "railproxy": "RAILPROXY_",
    "finledger": "FINLEDGER_",
    "worker": "WORKER_",
    "outbox": "OUTBOX_",
}


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    return []
