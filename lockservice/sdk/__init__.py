"""The lock service's async client SDK, what a worker links in to hold `payout:{account}`.

Owns: the process's session and heartbeat, the local lease deadline, the bounded retries
(`client`), the keep-alive HTTP transport (`transport`, docs/performance.md) and the releases the
process still owes the server (`releases`).
Must never: import the lock server (lockservice.server), hand out a `Lease` without a grant from
the server, or offer any way to proceed without one (FR-27).
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from lockservice.sdk.client import Lease, LockClient, NotAcquiredError, retry_budget_s
    from lockservice.sdk.transport import KeepAliveTransport

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "KeepAliveTransport": "lockservice.sdk.transport",
    "Lease": "lockservice.sdk.client",
    "LockClient": "lockservice.sdk.client",
    "NotAcquiredError": "lockservice.sdk.client",
    "retry_budget_s": "lockservice.sdk.client",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "KeepAliveTransport",
    "Lease",
    "LockClient",
    "NotAcquiredError",
    "retry_budget_s",
]
