"""The break-glass revoke (UC-06) through the lock service, which audits and alerts: an
accepted revoke command (`workflows.operator_desk`), carried out once (the workflow's revoke
coroutine, `workflows.operator_revokes`).
Revoking does not undo a side effect in flight, it only fences the old holder out.
"""

from __future__ import annotations

import httpx
from temporalio.exceptions import ApplicationError

from activities import models as m
from activities.payout.fenced import current_payout
from activities.payout.lookups import verdict_of
from common.lockkey import lock_key
from ledger import TERMINAL_STATES, PayoutStore

__all__ = ["RevokeSteps"]


class RevokeSteps:
    """carry_out_revoke (shared queue): it needs no grant of this process."""

    def __init__(self, *, store: PayoutStore, lock_http: httpx.AsyncClient) -> None:
        self._store = store
        # The lock server's HTTP API with the worker's bearer credential (common.credentials).
        self._lock_http = lock_http

    async def _post_revoke(self, req: m.RevokeRequest) -> httpx.Response:
        """The revoke request. The lock server verifies the operator assertion
        it carries (action, payout, expiry, its own signature) and audits the identity inside;
        without one it refuses."""
        body = {
            "key": lock_key(req.account_id),
            "operator": req.operator,
            "reason": req.reason,
            "payout_id": req.payout_id,
            "assertion": req.assertion,
        }
        return await self._lock_http.post("/v1/locks/revoke", json=body)

    async def carry_out_revoke(self, req: m.RevokeRequest) -> m.CommandVerdict:
        """An accepted revoke command, carried out once: the lock
        server verifies its operator assertion again (signature, action, payout, the lock key of
        the payout's account, expiry) and revokes; the command then ends `carried_out` with the
        audit row `lock_revoke_requested`, or `refused` with the server's reason (a 4xx).

        Retried without limit (an outage of the lock server or the database only delays it): a
        retry finds the command ended and does nothing. Only a retry after the lock server
        revoked but before the database recorded it can revoke twice; that costs the account's
        current holder its grant (it re-acquires with a higher token), never safety.
        """
        known = await self._store.command(req.command_id)
        if known is not None and known.outcome is not None:
            return verdict_of(known)
        payout = await current_payout(self._store, req.payout_id)
        if payout.state in TERMINAL_STATES:
            # The account's lock may belong to its next payout by now: never revoke it for this
            # one (the workflow cancels a revoke still pending when its payout ends).
            verdict = await self._store.settle_command(
                command_id=req.command_id,
                outcome="refused",
                code="terminal",
                why=f"payout reached {payout.state} before the revoke was carried out",
            )
            return verdict_of(verdict)
        response = await self._post_revoke(req)
        if response.status_code >= 500:
            raise ApplicationError(f"lock service unavailable: HTTP {response.status_code}")
        if response.status_code >= 400:
            code = _error_code(response)
            verdict = await self._store.settle_command(
                command_id=req.command_id,
                outcome="refused",
                code=code,
                why=f"the lock service refused the revoke: HTTP {response.status_code} "
                f"{code}: {response.text[:300]}",
            )
            return verdict_of(verdict)
        revoked = response.json()
        verdict = await self._store.settle_command(
            command_id=req.command_id,
            outcome="carried_out",
            why=f"revoked token {revoked.get('revoked_token')} of {lock_key(req.account_id)}",
            details=revoked,
            audit_action="lock_revoke_requested",
        )
        return verdict_of(verdict)


def _error_code(response: httpx.Response) -> str:
    """The lock server's stable error name (`{"code": ...}`), or the status as text."""
    try:
        body = response.json()
    except ValueError:
        return f"http_{response.status_code}"
    code = body.get("code") if isinstance(body, dict) else None
    return str(code) if code else f"http_{response.status_code}"
