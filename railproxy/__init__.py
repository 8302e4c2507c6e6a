"""Rail proxy: the rail Connection boundary and the second fencing enforcement point (FR-17..FR-20).

Owns: schema `railproxy` (per-account high-water tokens, submission attempts with adapter and
contract versions and the replica that made them, the Connection's budget shared by every
replica), the single forward of each attempt to the rail, the classification of its handoff
certainty (STD01-06), and the breaker, bulkhead and rate limit of the Connection (STD01-08: the
rate and concurrency for the Connection across every replica, `railproxy.budget`). Also ships
`railproxy.client` (typed async client) and `railproxy.conformance` (a reusable
rail-connection conformance suite, STD01-14).

Must never: forward an instruction before its attempt is durably recorded; forward a payout
that already has an attempt which may have reached the rail (whatever the token); accept a token
below the account's high-water mark, or any token whose grant the lock service's public keys do
not verify (INV-07: checked before the mark is touched; it holds no private key); retry a
submission at any layer; call the rail (submission or lookup) without a lease of the
Connection's shared budget; report NOT_SUBMITTED without authoritative evidence that nothing reached
the rail; read or write another component's tables; start with an enforcement switched off
outside an experiment mode verified against the rail stub (FR-29, `railproxy.startup`).
"""

from typing import TYPE_CHECKING

from common.lazy import lazy_exports

if TYPE_CHECKING:
    from railproxy.app import create_app
    from railproxy.client import RailProxyClient, SubmitResult
    from railproxy.models import HandoffCertainty, Outcome, SubmitContext, SubmitRequest
    from railproxy.settings import ProxySettings

#: Public name -> the module that defines it, imported on first use (common.lazy).
_EXPORTS = {
    "HandoffCertainty": "railproxy.models",
    "Outcome": "railproxy.models",
    "ProxySettings": "railproxy.settings",
    "RailProxyClient": "railproxy.client",
    "SubmitContext": "railproxy.models",
    "SubmitRequest": "railproxy.models",
    "SubmitResult": "railproxy.client",
    "create_app": "railproxy.app",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "HandoffCertainty",
    "Outcome",
    "ProxySettings",
    "RailProxyClient",
    "SubmitContext",
    "SubmitRequest",
    "SubmitResult",
    "create_app",
]
