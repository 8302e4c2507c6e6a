"""Operator commands: `payouts payout abandon|revoke` (a workflow Update to a payout's workflow,
which answers with its verdict; `--signal` sends a plain Temporal signal instead) and
`payouts lock revoke` (break-glass, straight to the lock server).

Every one carries the operator's identity as the lock server authenticates it from
$PAYOUTS_OPERATOR_TOKEN_FILE: the command carries the lock server's signed operator assertion
(bound to the payout, and for a revoke to its account's lock key), which the payment store
verifies once and records (single use), and the lock server again when it revokes
(docs/security.md); a typed name proves nothing. A refused command exits EXIT_CONFLICT (4) with
one line saying why.
Must never: send a command without an assertion, or hold the token anywhere but in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import httpx

from common.credentials import (
    OPERATOR_TOKEN_FILE_ENV,
    CredentialsError,
    auth_headers,
    operator_token,
)
from common.lockkey import lock_key
from payouts.errors import (
    EXIT_CONFLICT,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    CommandError,
    guard,
    payout_id_arg,
    require,
    workflow_error,
)
from payouts.settings import DEFAULT_LOCK_URL, connection_options, lock_url, temporal_address
from payouts.workload import connect_temporal, find_payout


async def _account_of(handle: Any, payout_id: str) -> str:
    """The payout's account, as its workflow carries it (search attribute `PayoutAccountId`):
    a revoke assertion is bound to that account's lock key."""
    from temporalio.service import RPCError

    from workflows.search_attributes import PAYOUT_ACCOUNT

    try:
        desc = await handle.describe()
    except RPCError as exc:
        raise workflow_error(exc, payout_id) from None
    account = desc.typed_search_attributes.get(PAYOUT_ACCOUNT)
    if not account:
        raise CommandError(f"payout {payout_id}: its workflow names no account yet; try again")
    return str(account)


def operator_assertion(
    lock_url: str, action: str, payout_id: str, reason: str, key: str | None = None
) -> dict[str, Any]:
    """The lock server's signed operator assertion for `action` on `payout_id` (bound to lock
    `key`: required for a revoke), obtained with the operator's token (docs/security.md).
    Unreachable: EXIT_UNAVAILABLE, and nothing is sent. The assertion holds no secret: it is
    safe in Temporal history, and single-use (the payment store records its nonce)."""
    token = _operator_token_or_fail()
    body = {"action": action, "payout_id": payout_id, "reason": reason}
    if key:
        body["key"] = key
    try:
        r = httpx.post(
            f"{lock_url}/v1/operator-assertions",
            json=body,
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
    assertion = r.json()
    if not isinstance(assertion, dict) or not isinstance(assertion.get("identity"), str):
        raise CommandError(f"lock server at {lock_url} answered no operator assertion")
    return assertion


async def send_command(args: argparse.Namespace, reason: str) -> int:
    """Obtain the assertion, send the command as an Update (or, with --signal, as a signal),
    and report the workflow's verdict: refused (one line, EXIT_CONFLICT), carried out, or
    accepted and still pending after --wait seconds."""
    from temporalio.client import (
        WorkflowUpdateFailedError,
        WorkflowUpdateRPCTimeoutOrCancelledError,
    )
    from temporalio.service import RPCError

    from activities.models import CommandRecord, OperatorCommand

    action = args.signal
    client = await connect_temporal(temporal_address(args))
    payout_id = await find_payout(client, args.payout_id)  # also as `payout list` prints it
    handle = client.get_workflow_handle(f"payout-{payout_id}")
    key = lock_key(await _account_of(handle, payout_id))
    assertion = operator_assertion(lock_url(args), action, payout_id, reason, key=key)
    command = OperatorCommand(operator=assertion["identity"], reason=reason, assertion=assertion)
    try:
        if args.as_signal:
            await handle.signal(action, command)
            print(
                f"sent {action} to payout-{payout_id} as a signal, as {assertion['identity']}: "
                f"no verdict comes back; see `payouts payout status {payout_id}`"
            )
            return 0
        record = await handle.execute_update(
            action, command, result_type=CommandRecord, rpc_timeout=timedelta(seconds=60)
        )
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise CommandError(
            f"{action} of payout {payout_id}: no verdict within 60 s (is a worker running its "
            "workflow?); the command may still be delivered when one does: see "
            f"`payouts payout status {payout_id}`",
            EXIT_UNAVAILABLE,
        ) from None
    except WorkflowUpdateFailedError as exc:
        why = str(exc.cause or exc)
        raise CommandError(
            f"{action} of payout {payout_id} refused: {why}", EXIT_CONFLICT
        ) from None
    except RPCError as exc:
        raise workflow_error(exc, payout_id, temporal_address(args)) from None
    record = await _verdict(handle, record, args.wait)
    return _report(payout_id, record)


async def _verdict(handle: Any, record: Any, wait_s: float) -> Any:
    """Follow an accepted command in the status query until it ends or `wait_s` passes."""
    from activities.models import PayoutStatus

    deadline = time.monotonic() + max(0.0, wait_s)
    while record.status in ("verifying", "pending") and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        status = await handle.query("status", result_type=PayoutStatus)
        record = next((c for c in status.commands if c.command_id == record.command_id), record)
    return record


def _report(payout_id: str, record: Any) -> int:
    who = record.actor or record.operator
    if record.status == "refused":
        raise CommandError(
            f"{record.action} of payout {payout_id} refused: {record.why}", EXIT_CONFLICT
        )
    if record.status == "carried_out":
        print(f"{record.action} of payout {payout_id} carried out, as {who}: {record.why}")
    else:
        print(
            f"{record.action} of payout {payout_id} accepted (verified as {who}, command "
            f"{record.command_id}); not carried out yet: "
            + (
                "it waits for the account's lock"
                if record.action == "abandon"
                else "it waits for the lock service"
            )
            + f"; follow it with `payouts payout status {payout_id}`"
        )
    return 0


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


def _cmd_signal(args: argparse.Namespace) -> int:
    reason = require(args.reason, "reason")
    return asyncio.run(send_command(args, reason))


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
    answer = r.json()
    if answer.get("revoked_token") is None:
        # Nothing was granted, so nothing was revoked: an operator must not read "revoked".
        raise CommandError(f"lock {key} has no holder: nothing was revoked", EXIT_NOT_FOUND)
    if args.json:
        print(json.dumps(answer))
    else:
        print(
            f"revoked {key}: token {answer['revoked_token']} ended, as {answer['operator']} "
            f"at {answer['at']} ({answer['reason']}); the next grant's token is higher"
        )
    return 0


def register_signals(psub: Any) -> None:
    """`payouts payout abandon|revoke`, under `payouts payout` (`payouts.payout_cli.register`)."""
    for name, help_ in (
        ("abandon", "RAIL_AMBIGUOUS -> ABANDONED, after the SLA escalated"),
        ("revoke", "force-revoke this payout's lock (break-glass)"),
    ):
        p = psub.add_parser(name, help=help_)
        p.add_argument("payout_id", type=payout_id_arg, help="PAYOUT_ID or payout-PAYOUT_ID")
        p.add_argument(
            "--operator",
            help=f"ignored: the identity of ${OPERATOR_TOKEN_FILE_ENV}, asserted by the lock "
            "server, is audited",
        )
        p.add_argument("--reason", required=True, help="why (audited; e.g. a ticket number)")
        p.add_argument(
            "--wait",
            type=float,
            default=30.0,
            metavar="S",
            help="seconds to follow an accepted command until it is carried out (default 30)",
        )
        p.add_argument(
            "--signal",
            dest="as_signal",
            action="store_true",
            help="send it as a Temporal signal (no verdict comes back) instead of an Update",
        )
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
    rev.add_argument("--json", action="store_true", help="the lock server's answer as JSON")
    rev.set_defaults(func=guard(_cmd_lock_revoke))
