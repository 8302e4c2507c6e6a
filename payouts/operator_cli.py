"""Operator commands: `payouts payout abandon|revoke` (signals to a payout's workflow) and
`payouts lock revoke` (break-glass, straight to the lock server).

Every one carries the operator's identity as the lock server authenticates it from
$PAYOUTS_OPERATOR_TOKEN_FILE: a signal carries the lock server's signed operator assertion, which
the workflow and the enforcement points verify (docs/security.md); a typed name proves nothing.
Must never: send a signal without an assertion, or hold the token anywhere but in memory.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, Any

import httpx

from common.credentials import (
    OPERATOR_TOKEN_FILE_ENV,
    CredentialsError,
    auth_headers,
    operator_token,
)
from common.lockkey import lock_key
from payouts.errors import EXIT_UNAVAILABLE, CommandError, guard, require, workflow_error
from payouts.settings import DEFAULT_LOCK_URL, connection_options, lock_url, temporal_address
from payouts.workload import connect_temporal

if TYPE_CHECKING:
    from activities.models import OperatorCommand


async def signal_payout(address: str, payout_id: str, name: str, command: OperatorCommand) -> None:
    from temporalio.service import RPCError

    client = await connect_temporal(address)
    handle = client.get_workflow_handle(f"payout-{payout_id}")
    try:
        await handle.signal(name, command)
    except RPCError as exc:
        raise workflow_error(exc, payout_id) from None


def _operator_token_or_fail() -> str:
    try:  # the lock server authenticates this token; a typed name would prove nothing
        token = operator_token()
    except CredentialsError as exc:
        raise CommandError(str(exc)) from None
    if token is None:
        raise CommandError(
            f"no operator token: set {OPERATOR_TOKEN_FILE_ENV} (`payouts up` prints the line)"
        )
    return token


def operator_assertion(lock_url: str, action: str, payout_id: str, reason: str) -> dict[str, Any]:
    """The lock server's signed operator assertion for `action` on `payout_id`, obtained with the
    operator's token (docs/security.md). Unreachable: EXIT_UNAVAILABLE, and nothing is signalled.
    The assertion holds no secret: it is safe in Temporal history."""
    token = _operator_token_or_fail()
    try:
        r = httpx.post(
            f"{lock_url}/v1/operator-assertions",
            json={"action": action, "payout_id": payout_id, "reason": reason},
            headers=auth_headers(token),
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise CommandError(
            f"lock server at {lock_url} unreachable: {exc}; nothing was sent", EXIT_UNAVAILABLE
        ) from None
    if r.status_code >= 400:
        raise CommandError(
            f"operator assertion refused: HTTP {r.status_code} {r.text[:200]}; nothing was sent"
        )
    body = r.json()
    if not isinstance(body, dict) or not isinstance(body.get("identity"), str):
        raise CommandError(f"lock server at {lock_url} answered no operator assertion")
    return body


def _cmd_signal(args: argparse.Namespace) -> int:
    from activities.models import OperatorCommand

    reason = require(args.reason, "reason")
    assertion = operator_assertion(lock_url(args), args.signal, args.payout_id, reason)
    identity = assertion["identity"]
    command = OperatorCommand(operator=identity, reason=reason, assertion=assertion)
    asyncio.run(signal_payout(temporal_address(args), args.payout_id, args.signal, command))
    print(
        f"sent {args.signal} to payout-{args.payout_id} as {identity} (operator assertion "
        f"valid until {assertion.get('expires_at')}); the workflow and the enforcement points "
        f"check it (see `payouts payout status {args.payout_id}`)"
    )
    return 0


def _cmd_lock_revoke(args: argparse.Namespace) -> int:
    reason = require(args.reason, "reason")
    url = lock_url(args)
    key = args.key or lock_key(require(args.account, "account"))
    token = _operator_token_or_fail()  # the lock server audits the identity it authenticates
    try:
        r = httpx.post(
            f"{url}/v1/locks/revoke",
            json={"key": key, "reason": reason},
            headers=auth_headers(token),
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise CommandError(f"lock server at {url} unreachable: {exc}", EXIT_UNAVAILABLE) from None
    if r.status_code >= 400:
        raise CommandError(f"revoke refused: HTTP {r.status_code} {r.text}")
    print(f"revoked {key}: {r.json()}")
    return 0


def register_signals(psub: Any) -> None:
    """`payouts payout abandon|revoke`, under `payouts payout` (`payouts.payout_cli.register`)."""
    for name, help_ in (
        ("abandon", "RAIL_AMBIGUOUS -> ABANDONED, after the SLA escalated"),
        ("revoke", "force-revoke this payout's lock (break-glass)"),
    ):
        p = psub.add_parser(name, help=help_)
        p.add_argument("payout_id")
        p.add_argument(
            "--operator",
            help=f"ignored: the identity of ${OPERATOR_TOKEN_FILE_ENV}, asserted by the lock "
            "server, is audited",
        )
        p.add_argument("--reason", required=True, help="why (audited; e.g. a ticket number)")
        p.add_argument(
            "--lock-url",
            help="the lock server that issues the operator assertion (default $LOCK_URL or "
            f"{DEFAULT_LOCK_URL})",
        )
        connection_options(p, temporal=True)
        p.set_defaults(func=guard(_cmd_signal), signal=name)


def register(sub: Any) -> None:
    lock = sub.add_parser("lock", help="lock-service operator commands")
    lsub = lock.add_subparsers(dest="lock_command", required=True)
    rev = lsub.add_parser("revoke", help="force-revoke a lock (audited; next token is higher)")
    rev.add_argument("--key", help="lock key, e.g. payout:acct-00001")
    rev.add_argument("--account", help="shorthand for --key payout:ACCOUNT")
    rev.add_argument(
        "--operator", help=f"ignored: the identity of ${OPERATOR_TOKEN_FILE_ENV} is audited"
    )
    rev.add_argument("--reason", required=True, help="why (audited; e.g. a ticket number)")
    rev.add_argument("--lock-url", help=f"default $LOCK_URL or {DEFAULT_LOCK_URL}")
    rev.set_defaults(func=guard(_cmd_lock_revoke))
