"""The lock server's break-glass routes: force-revoke, the signed operator assertions that let a
worker carry one out (lockservice.verifiers.assertions), and the epoch bump of the restore
procedure.

Every change here is audited under the caller's authenticated identity, never a free-text name;
a worker-sent revoke is carried out only with an operator assertion this server signed for that
payout and action (with verification on), and a refused one is a 403 that revokes nothing.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from common.credentials import Identity
from common.logs import get_logger
from lockservice import api
from lockservice.server.signing import sign_assertion
from lockservice.server.state import Access, ServerState
from lockservice.server.wire import (
    ERROR_RESPONSES,
    AssertionIn,
    AssertionOut,
    BumpEpochIn,
    BumpEpochOut,
    RevokeIn,
    RevokeOut,
    error_response,
    iso,
)
from lockservice.verifiers import AssertionRefused, OperatorAssertion

_log = get_logger("lockservice.server")


def add_break_glass_routes(app: FastAPI, state: ServerState, access: Access) -> None:
    """Force-revoke, the operator assertions that let a worker carry one out, and the epoch
    bump of the restore procedure: every change here is audited under the caller's identity."""
    run, operator_only, revoker = state.run, access.operator_only, access.revoker

    @app.post(
        "/v1/locks/revoke", name="force_revoke", response_model=RevokeOut, responses=ERROR_RESPONSES
    )
    async def force_revoke(body: RevokeIn, who: Identity = revoker) -> Response:
        """Break-glass: ends the current grant and advances the token (FR-08). The backend emits
        the `lock.revoked` audit event and the `alert` event, naming the authenticated operator
        (the body's `operator` is ignored)."""
        key = api.validate_key(body.key)
        actor, reason = who.name, body.reason
        if who.kind == "component":
            refused, actor, reason = _asserted_revoke(state, body, key)
            if refused is not None:
                return refused
        operator, reason = api.validate_operator(actor, reason)
        r = await run("force_revoke", lambda: state.be().force_revoke(key, operator, reason))
        return JSONResponse(
            {
                "key": r.key,
                "revoked_token": r.revoked_token,
                "operator": r.operator,
                "reason": r.reason,
                "at": iso(r.at),
            }
        )

    @app.post(
        "/v1/operator-assertions",
        name="issue_operator_assertion",
        response_model=AssertionOut,
        responses=ERROR_RESPONSES,
    )
    async def issue_operator_assertion(
        body: AssertionIn, who: Identity = operator_only
    ) -> Response:
        """Operators only: a short-lived signed statement that the authenticated operator asks
        for `action` on `payout_id`, for `payouts payout revoke|abandon` to carry in its
        Temporal signal (no secret travels in Temporal history). Changes nothing here."""
        return JSONResponse(_issue_assertion(state, body, who).to_json())

    @app.post(
        "/v1/epoch/bump", name="bump_epoch", response_model=BumpEpochOut, responses=ERROR_RESPONSES
    )
    async def bump_epoch(body: BumpEpochIn, who: Identity = operator_only) -> Response:
        """Restore procedure: every key's next token moves above anything issued before.
        Operators only; the authenticated operator is audited."""
        operator, reason = api.validate_operator(who.name, body.reason)
        epoch = await run(
            "bump_epoch", lambda: state.be().bump_epoch(body.min_epoch, operator, reason)
        )
        return JSONResponse({"epoch": epoch})


def _issue_assertion(state: ServerState, body: AssertionIn, who: Identity) -> OperatorAssertion:
    """A signed operator assertion for `who`, valid from now for the configured lifetime; bad
    input (e.g. a blank reason) is a 422 and nothing is signed. Emits the issuance event."""
    now = datetime.now(UTC)
    try:
        a = sign_assertion(
            state.signer,
            identity=who.name,
            action=body.action,
            payout_id=body.payout_id,
            reason=body.reason,
            issued_at=now,
            expires_at=now + timedelta(seconds=state.assertion_ttl_s),
            nonce=secrets.token_urlsafe(16),
            key=body.key or "",
        )
    except ValueError as exc:
        raise api.InvalidRequest(str(exc)) from None
    _log.info(
        "lock.operator_assertion_issued",
        operator=a.identity,
        action=a.action,
        payout_id=a.payout_id,
        expires_at=a.expires_at.isoformat(),
        kid=a.kid,
    )
    return a


def _asserted_revoke(
    state: ServerState, body: RevokeIn, key: str
) -> tuple[JSONResponse | None, str, str]:
    """A worker-sent revoke: (refusal, actor, reason). With verification on, the actor and
    reason are those of the operator assertion, checked for action `revoke`, the payout the
    worker names and (if the assertion names one) this key, by this server's clock; a refusal
    is a 403 and nothing is revoked. Off (experiment switch): the free-text name, marked."""
    if not state.verify_assertions:
        return None, f"worker/unverified:{(body.operator or 'unknown')[:100]}", body.reason
    try:
        a = state.assertion_verifier().verify(
            body.assertion, action="revoke", payout_id=body.payout_id or "", key=key
        )
    except AssertionRefused as exc:
        refusal = error_response(403, f"operator_assertion_{exc.code}", str(exc)[:300])
        return refusal, "", ""
    return None, a.identity, a.reason
