"""The lock-key contract: which lock key protects which resource, written once (A-15).

One payout per account is in flight: the key `payout:{account_id}` is the account's payout
stream. The worker acquires it, the payment database and the rail proxy check a grant against
it, the invariant checker and the chaos summary read grant histories by it. Were two of them to
spell it differently, a grant for one key would be checked against another (a false fence, or
none), so every one of them imports it from here.
"""

from __future__ import annotations

#: Every payout lock key starts with this; what follows is the account id.
PAYOUT_KEY_PREFIX = "payout:"


def lock_key(account_id: str) -> str:
    """The lock key that protects `account_id`'s payout stream."""
    return f"{PAYOUT_KEY_PREFIX}{account_id}"
