"""INV-10's blocked-account rule (issue 24 item 6): no account's lock is held by a live session
with no payout of the account in flight under it, for longer than a bound. Pure: the holdings
are gathered by `invariants.holds`, the payment database's writes and the proxy's attempts by
`invariants.checker`.

Why it belongs to INV-10 ("no payout is stranded"): such a grant strands every later payout of
the account, which waits for the lock for as long as the holder's session lives, and a worker's
session lives as long as the worker (its heartbeat). It is not caught by INV-10's other rules: a
run blocked this way never settles, so "terminal or escalated" is never judged, and no workflow
closes.

"In flight under the grant" is judged by its USE: the grant was acquired, or a write to the
account's payouts (audit row) or a proxy attempt presented its token, within `bound_s` before
the holding was observed. A critical section writes or submits within seconds of each step
(claim, submit, record, post; the proxy answers within its rail timeout), so a grant unused for
longer has no work under it. The default bound is longer than the longest a healthy worker
takes to give back a grant its workflow left behind: the idle-lease sweeper's 60 s
(WORKER_LEASE_IDLE_S) plus its 5 s period plus one release (the SDK's backoff cap and a
request timeout, 7 s), with room to spare.

Owns: what counts as a blocked account, and the wording of its violation. Must never: do I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from common.lockkey import PAYOUT_KEY_PREFIX
from invariants.evidence import Evidence, HoldFact

_TERMINAL = frozenset({"POSTED", "FAILED", "ABANDONED"})


def blocked_accounts(ev: Evidence) -> list[str]:
    """One violation per payout lock held by a live session and unused for longer than
    `ev.hold_bound_s` (see the module docstring)."""
    bound = timedelta(seconds=ev.hold_bound_s)
    used = _last_use(ev)
    waiting: dict[str, int] = defaultdict(int)
    for p in ev.payouts:
        if p.state not in _TERMINAL:
            waiting[p.account_id] += 1
    out = []
    for h in ev.holds:
        if not h.key.startswith(PAYOUT_KEY_PREFIX):
            continue
        last = max(h.acquired_at, used.get((h.account_id, h.token), h.acquired_at))
        idle = h.observed_at - last
        if idle > bound:
            out.append(
                f"account {h.account_id} blocked: {h.key} held under token={h.token} by live"
                f" session {h.session_id}, unused for {idle.total_seconds():.0f}s"
                f" (bound {ev.hold_bound_s:.0f}s); {waiting[h.account_id]} payout(s) of the"
                " account not terminal"
            )
    return out


def _last_use(ev: Evidence) -> dict[tuple[str, int], datetime]:
    """Per (account, token): the latest write or proxy attempt that presented the token."""
    out: dict[tuple[str, int], datetime] = {}
    uses: Iterable[tuple[str | None, int, datetime]] = [
        *((w.account_id, w.token, w.at) for w in ev.writes),
        *((a.account_id, a.token, a.recorded_at) for a in ev.attempts),
    ]
    for account_id, token, at in uses:
        if account_id is None:
            continue
        k = (account_id, token)
        if k not in out or at > out[k]:
            out[k] = at
    return out


def held_keys(holds: Sequence[HoldFact]) -> list[str]:
    """The payout lock keys held (for a report's `checked` sizes and the chaos summary)."""
    return sorted({h.key for h in holds if h.key.startswith(PAYOUT_KEY_PREFIX)})
