"""The invariant checker's rules (INV-01..INV-10, docs/architecture.md#requirement-ids):
pure functions over one body of evidence, gathered read-only by `invariants.checker`.

Owns: what counts as a violation of each invariant, and the wording of each violation. Must never:
do I/O, or drop an invariant from the result (all ten are always present, zeros included).

The evidence they judge, and what each part stands for, is `invariants.evidence`.

"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from common.lockkey import lock_key
from invariants.blocked import blocked_accounts

# The evidence types are imported from here by callers that predate `invariants.evidence`.
from invariants.evidence import (
    AttemptRow,
    Evidence,
    GrantFact,
    GrantHistory,
    PayoutRow,
    Transition,
    WorkflowFact,
    Write,
)
from railstub.client import MONEY_MOVED

__all__ = [
    "BALANCE_STAMPING",
    "DECIDED",
    "INVARIANTS",
    "TERMINAL",
    "WORKFLOW_ID_PREFIX",
    "AttemptRow",
    "Evidence",
    "GrantFact",
    "GrantHistory",
    "PayoutRow",
    "Transition",
    "WorkflowFact",
    "Write",
    "check",
]

INVARIANTS: dict[str, str] = {
    "INV-01": "at most one worker mutates a payout at a time",
    "INV-02": "at most one rail submission succeeds per payout",
    "INV-03": "the ledger balances",
    "INV-04": "fencing tokens never repeat and never go backwards for a key",
    "INV-05": "a resource never accepts a write below its stored fence",
    "INV-06": "mutual exclusion of grants",
    "INV-07": "no side effect without a grant",
    "INV-08": "terminal states are terminal",
    "INV-09": "payout state agrees with the rail's evidence",
    "INV-10": "no payout is stranded",
}
TERMINAL = frozenset({"POSTED", "FAILED", "ABANDONED"})
#: Proxy outcomes that count as a submission that succeeded in reaching a decision (INV-02).
DECIDED = frozenset({"ACKED", "DECLINED"})
#: Store operations that stamp the account's balance row as well as the payout row.
BALANCE_STAMPING = frozenset({"claim", "post"})
#: A payout workflow's id (activities.redrive.start_payout): one running workflow per payout.
WORKFLOW_ID_PREFIX = "payout-"


def check(ev: Evidence) -> dict[str, list[str]]:
    """Every violation per invariant, sorted; all ten keys always present. Pure."""
    grants = _GrantIndex(ev.grants)
    found = {
        "INV-01": _inv01(ev, grants),
        "INV-02": _inv02(ev),
        "INV-03": list(ev.ledger_subjects),
        "INV-04": _inv04(ev.grants),
        "INV-05": _inv05(ev),
        "INV-06": _inv06(ev.grants),
        "INV-07": _inv07(ev, grants),
        "INV-08": _inv08(ev),
        "INV-09": _inv09(ev),
        "INV-10": _inv10(ev),
    }
    return {inv: sorted(set(found[inv])) for inv in INVARIANTS}


class _GrantIndex:
    """Grants per key in acquisition order, with a running maximum of the tokens issued."""

    def __init__(self, grants: Iterable[GrantFact]) -> None:
        per_key: dict[str, list[GrantFact]] = defaultdict(list)
        for g in grants:
            per_key[g.key].append(g)
        self._times: dict[str, list[datetime]] = {}
        self._max: dict[str, list[int]] = {}
        self.acquired: dict[tuple[str, int], list[datetime]] = defaultdict(list)
        for key, gs in per_key.items():
            gs.sort(key=lambda g: (g.acquired_at, g.seq))
            self._times[key] = [g.acquired_at for g in gs]
            running, highest = [], 0
            for g in gs:
                highest = max(highest, g.token)
                running.append(highest)
                self.acquired[(key, g.token)].append(g.acquired_at)
            self._max[key] = running

    def highest_before(self, key: str, at: datetime) -> int | None:
        """The highest token issued for `key` by grants acquired strictly before `at`."""
        n = bisect.bisect_left(self._times.get(key, []), at)
        return self._max[key][n - 1] if n else None

    def granted_before(self, key: str, token: int, at: datetime) -> bool:
        """Was a grant with exactly this token acquired at or before `at`?"""
        return any(t <= at for t in self.acquired.get((key, token), ()))


def _payout_writes(ev: Evidence) -> dict[str, list[Write]]:
    """Per payout, its fenced transitions (audit rows with a token and a to_state), in order."""
    out: dict[str, list[Write]] = defaultdict(list)
    for w in ev.writes:
        if w.payout_id is not None and w.to_state is not None:
            out[w.payout_id].append(w)
    return out


def _backwards(ws: Sequence[Write]) -> Iterable[tuple[Write, int]]:
    """Each write presenting a token below one already written to the same payout."""
    highest = 0
    for w in ws:
        if w.token < highest:
            yield w, highest
        highest = max(highest, w.token)


def _inv01(ev: Evidence, grants: _GrantIndex) -> list[str]:
    """Per payout, writes ordered by non-decreasing token; per account, every write under the
    highest token the account's enforcement point had seen when it committed.

    "The currently-highest token" is read from the resource's side: the highest token already
    presented to the account (A-15: the lock protects the account's payout stream). A holder
    superseded at the lock service but not yet at the resource (the new holder has written
    nothing) can still land a write; no resource can know about a token it has not seen, which
    is why fencing exists. That write is still totally ordered before every write of the new
    holder, so no two workers interleave on a payout. `grants` stays in the signature for the
    grant-based rules (INV-07).
    """
    del grants
    out = []
    for payout_id, ws in _payout_writes(ev).items():
        for w, prev in _backwards(ws):
            out.append(f"{payout_id} audit#{w.audit_id} token={w.token} after token={prev}")
    per_account: dict[str, list[Write]] = defaultdict(list)
    for w in ev.writes:
        if w.account_id is not None and w.to_state is not None:
            per_account[w.account_id].append(w)
    for account_id, ws in per_account.items():
        ws.sort(key=lambda w: w.audit_id)
        for w, prev in _backwards(ws):
            out.append(
                f"account {account_id} audit#{w.audit_id} ({w.payout_id}) token={w.token}"
                f" after token={prev} on the account"
            )
    return out


def _inv02(ev: Evidence) -> list[str]:
    """At most one decided (ACKED/DECLINED) attempt per payout, one rail movement per reference."""
    decided: dict[str, int] = defaultdict(int)
    for a in ev.attempts:
        if a.outcome in DECIDED:
            decided[a.payout_id] += 1
    out = [f"{p}: {n} decided attempts" for p, n in decided.items() if n > 1]
    per_ref: dict[str, int] = defaultdict(int)
    for mv in ev.movements:
        per_ref[mv.client_reference] += 1
    # The rail's log is the real evidence of a duplicate payment: it has no idempotency.
    out += [f"{ref}: {n} rail movements" for ref, n in per_ref.items() if n > 1]
    return out


def _inv04(grants: Sequence[GrantFact]) -> list[str]:
    """Per key, in issue order, every token is above every token issued before it."""
    per_key: dict[str, list[GrantFact]] = defaultdict(list)
    for g in grants:
        per_key[g.key].append(g)
    out = []
    for key, gs in per_key.items():
        gs.sort(key=lambda g: (g.acquired_at, g.seq))
        highest: int | None = None
        for g in gs:
            if highest is not None and g.token <= highest:
                out.append(f"{key} token={g.token} issued after token={highest}")
            highest = g.token if highest is None else max(highest, g.token)
    return out


def _inv05(ev: Evidence) -> list[str]:
    """Fences never go backwards, and each stored fence covers the highest token written."""
    return _paydb_fences(ev) + _proxy_fences(ev)


def _paydb_fences(ev: Evidence) -> list[str]:
    out = []
    payout_writes = _payout_writes(ev)
    for payout_id, ws in payout_writes.items():
        for w, prev in _backwards(ws):
            out.append(f"payout {payout_id} audit#{w.audit_id} token={w.token} below {prev}")
    # Every fenced UPDATE of a payout writes an audit row, so the row's fence is exactly the
    # last token written to it (and the highest, unless it went backwards).
    for p in ev.payouts:
        expected = max((w.token for w in payout_writes.get(p.payout_id, [])), default=0)
        if p.fence != expected:
            out.append(f"payout {p.payout_id} fence={p.fence} != highest write {expected}")
    # A balance row can be stamped without an audit row (a claim or post that found the payout
    # already advanced commits the stamp): so the stored fence must be AT LEAST the highest.
    stamped: dict[str, int] = defaultdict(int)
    for w in ev.writes:
        if w.account_id is not None and w.action in BALANCE_STAMPING and w.to_state is not None:
            stamped[w.account_id] = max(stamped[w.account_id], w.token)
    for account_id, highest in stamped.items():
        fence = ev.balance_fences.get(account_id, 0)
        if fence < highest:
            out.append(f"balance {account_id} fence={fence} < highest write {highest}")
    return out


def _proxy_fences(ev: Evidence) -> list[str]:
    """Per account, attempts in recorded order never go below a token already recorded, and the
    high-water mark covers them all."""
    out = []
    highest: dict[str, int] = {}
    for a in ev.attempts:
        prev = highest.get(a.account_id)
        if prev is not None and a.token < prev:
            out.append(f"proxy {a.account_id} attempt#{a.attempt_id} token={a.token} below {prev}")
        highest[a.account_id] = a.token if prev is None else max(prev, a.token)
    for account_id, top in highest.items():
        fence = ev.proxy_fences.get(account_id, 0)
        if fence < top:
            out.append(f"proxy {account_id} high_token={fence} < highest attempt {top}")
    return out


def _inv06(grants: Sequence[GrantFact]) -> list[str]:
    """Per key, no two validity intervals [acquired_at, ended_at) overlap (None = still open)."""
    per_key: dict[str, list[GrantFact]] = defaultdict(list)
    for g in grants:
        per_key[g.key].append(g)
    out = []
    for key, gs in per_key.items():
        gs.sort(key=lambda g: (g.acquired_at, g.seq))
        latest: GrantFact | None = None  # the grant seen so far that ends last
        for g in gs:
            if latest is not None and (latest.ended_at is None or g.acquired_at < latest.ended_at):
                out.append(f"{key} token={g.token} overlaps token={latest.token}")
            if latest is None or _ends_after(g, latest):
                latest = g
    return out


def _ends_after(a: GrantFact, b: GrantFact) -> bool:
    if a.ended_at is None:
        return True
    return b.ended_at is not None and a.ended_at > b.ended_at


def _inv07(ev: Evidence, grants: _GrantIndex) -> list[str]:
    """Every attempt and every tokened write presents a token granted for its account before.
    Those made before the history's horizon are not judged: their grant may have been pruned."""
    out = []
    since = ev.grants_complete_since
    for a in ev.attempts:
        if since is not None and a.recorded_at < since:
            continue
        if not grants.granted_before(lock_key(a.account_id), a.token, a.recorded_at):
            out.append(f"attempt#{a.attempt_id} {a.payout_id} token={a.token} without grant")
    for w in ev.writes:
        if since is not None and w.at < since:
            continue
        if w.account_id is None or not grants.granted_before(lock_key(w.account_id), w.token, w.at):
            out.append(f"audit#{w.audit_id} {w.action} token={w.token} without grant")
    return out


def _inv08(ev: Evidence) -> list[str]:
    """No audited transition leaves a terminal state, and no terminal payout changed since."""
    out = []
    last: dict[str, Transition] = {}
    for t in ev.transitions:
        if t.from_state in TERMINAL:
            out.append(f"{t.payout_id} audit#{t.audit_id} {t.from_state}->{t.to_state}")
        last[t.payout_id] = t
    for p in ev.payouts:
        final = last.get(p.payout_id)
        # An unaudited change (no audit row at all) out of the last audited terminal state.
        if final is not None and final.to_state in TERMINAL and p.state != final.to_state:
            out.append(f"{p.payout_id} is {p.state} after terminal {final.to_state}")
    return out


def _inv09(ev: Evidence) -> list[str]:
    """A FAILED payout has no movement under which money moved; a POSTED payout has exactly one.

    The rail's movement log is the evidence (matched by client reference, which the proxy
    forwards unchanged). FAILED while the rail moved the money is the finance break of an
    unsound "absent"; POSTED without a movement is a ledger entry for money that never left.
    ABANDONED is an operator's accepted risk (the reconciler's `abandoned_but_settled`), and
    non-terminal payouts are still being worked on: neither is judged here.
    """
    moved: dict[str, int] = defaultdict(int)
    for mv in ev.movements:
        if mv.status in MONEY_MOVED:
            moved[mv.client_reference] += 1
    out = []
    for p in ev.payouts:
        n = moved.get(p.client_reference, 0)
        if p.state == "FAILED" and n:
            out.append(f"{p.payout_id} is FAILED but the rail moved money {n} time(s)")
        elif p.state == "POSTED" and n != 1:
            out.append(f"{p.payout_id} is POSTED with {n} rail movement(s) that moved money")
    return out


def _inv10(ev: Evidence) -> list[str]:
    """No payout is stranded: once settled, each is terminal or RAIL_AMBIGUOUS and escalated;
    and no payout workflow closed (failed, terminated, timed out, canceled) while its payout is
    not terminal, since nothing drives it until it is re-driven (activities.redrive).

    The first rule needs a settled system (mid-run, payouts are legitimately in between), so it
    applies only when the caller says so (`settled`). The third, at any time: no account's lock
    is held by a live session with nothing in flight under it past a bound (`blocked.py`)."""
    state = {p.payout_id: p.state for p in ev.payouts}
    out = []
    if ev.settled:
        for p in ev.payouts:
            if p.state in TERMINAL:
                continue
            if p.state == "RAIL_AMBIGUOUS" and p.payout_id in ev.escalated:
                continue
            what = "not escalated" if p.state == "RAIL_AMBIGUOUS" else "not terminal"
            out.append(f"{p.payout_id} is {p.state} after settling ({what})")
    for w in ev.workflows:
        payout_id = w.workflow_id.removeprefix(WORKFLOW_ID_PREFIX)
        current = state.get(payout_id)
        if current is not None and current not in TERMINAL:
            out.append(f"workflow {w.workflow_id} is {w.status} while the payout is {current}")
    # An account whose lock a live session holds unused past a bound (invariants.blocked).
    return out + blocked_accounts(ev)
