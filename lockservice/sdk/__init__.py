"""The lock service's async client SDK, what a worker links in to hold `payout:{account}`.

Owns: the process's session and local lease deadline (`client`), the lease it hands out
(`lease`), the heartbeat and watchdog (`heartbeat`), the bounded retries (`calls`), one acquire per
key at a time (`turns`), the keep-alive HTTP transport (`transport`, docs/performance.md) and the
releases the process still owes the server (`releases`).
Must never: import the lock server (lockservice.server), hand out a `Lease` without a grant from
the server, or offer any way to proceed without one (FR-27).
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from lockservice.sdk.calls import retry_budget_s
    from lockservice.sdk.client import LockClient
    from lockservice.sdk.lease import Lease, NotAcquiredError
    from lockservice.sdk.transport import KeepAliveTransport

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "KeepAliveTransport": "lockservice.sdk.transport",
    "Lease": "lockservice.sdk.lease",
    "LockClient": "lockservice.sdk.client",
    "NotAcquiredError": "lockservice.sdk.lease",
    "retry_budget_s": "lockservice.sdk.calls",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "KeepAliveTransport",
    "Lease",
    "LockClient",
    "NotAcquiredError",
    "retry_budget_s",
]
