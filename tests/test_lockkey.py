"""The lock-key contract is written once (common.lockkey) and every party uses that one.

The worker acquires the key, the payment database and the rail proxy check grants against it,
the invariant checker and the chaos summary read grant histories by it: a second spelling
anywhere would check a grant against the wrong key.
"""

from __future__ import annotations

import re
from pathlib import Path

from common import lockkey

ROOT = Path(__file__).resolve().parent.parent
#: A string literal that spells a payout lock key by hand.
SPELLED = re.compile(r"""["']payout:""")


def test_the_key_is_the_accounts_payout_stream() -> None:
    assert lockkey.lock_key("acct-1") == "payout:acct-1"
    assert lockkey.lock_key("acct-1").startswith(lockkey.PAYOUT_KEY_PREFIX)


def test_every_party_uses_the_one_definition() -> None:
    import activities.payout.grants
    import invariants.rules
    import ledger.store
    import railproxy.service

    for module in (
        activities.payout.grants,
        invariants.rules,
        ledger.store,
        railproxy.service,
    ):
        assert module.lock_key is lockkey.lock_key, module.__name__


def test_no_code_spells_the_key_by_hand() -> None:
    """Negative control in the test itself: the pattern does find the definition's own prefix."""
    own = (ROOT / "common" / "lockkey.py").read_text()
    assert SPELLED.search(own)
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in ROOT.rglob("*.py")
        # the lock service itself is key-agnostic: its docs may show an example key
        if not {".venv", "tests", "lockservice"} & set(p.relative_to(ROOT).parts)
        and p.name != "lockkey.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SPELLED.search(line)
    ]
    assert not offenders, f"lock keys spelled outside common/lockkey.py: {offenders}"
