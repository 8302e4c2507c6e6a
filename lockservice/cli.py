"""Operator commands of the lock service: `python -m lockservice serve|inspect|revoke|bump-epoch`.

Owns: argument parsing, readable output, and a non-zero exit with one clear line on any error.
Must never: decide anything from `inspect` output (a snapshot, FR-07), or revoke without an
operator identity and a reason (FR-08). Talks to a running lock server over HTTP (`--url`,
default `$LOCK_URL` or http://127.0.0.1:8701), except `serve`, which is the server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8701"


class CliError(Exception):
    """An operator-facing failure; its message is printed as one line and the exit code is 1."""


def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> dict[str, Any]:
    url = args.url or os.environ.get("LOCK_URL") or DEFAULT_URL
    try:
        with httpx.Client(base_url=url, timeout=args.timeout) as http:
            resp = http.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach lock server at {url}: {type(exc).__name__}: {exc}") from exc
    try:
        body = resp.json()
    except ValueError:
        body = {"code": "http_error", "message": resp.text[:200]}
    if not resp.is_success:
        code = body.get("code", resp.status_code) if isinstance(body, dict) else resp.status_code
        msg = body.get("message", "") if isinstance(body, dict) else str(body)
        raise CliError(f"lock server refused ({resp.status_code} {code}): {msg}")
    return body if isinstance(body, dict) else {}


def _rows(pairs: list[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in pairs)


def _cmd_inspect(args: argparse.Namespace) -> int:
    info = _call(args, "GET", "/v1/locks", params={"key": args.key})
    print(
        _rows(
            [
                ("key", info.get("key")),
                ("state", "held" if info.get("holder_session") else "free"),
                ("holder_session", info.get("holder_session")),
                ("token", info.get("token")),
                ("acquired_at", info.get("acquired_at")),
                ("expires_at", info.get("expires_at")),
                ("waiters", info.get("waiters")),
                ("last_token", info.get("last_token")),
            ]
        )
    )
    print("(snapshot for operators: never use it for a correctness decision)")
    return 0


def _require(value: str | None, what: str) -> str:
    if value is None or not value.strip():
        raise CliError(f"{what} is required (break-glass actions are audited with who and why)")
    return value


def _cmd_revoke(args: argparse.Namespace) -> int:
    body = {
        "key": args.key,
        "operator": _require(args.operator, "--operator"),
        "reason": _require(args.reason, "--reason"),
    }
    r = _call(args, "POST", "/v1/locks/revoke", json=body)
    revoked = r.get("revoked_token")
    print(
        f"revoked {r.get('key')}: token {revoked} ended; the next grant gets a higher token"
        if revoked is not None
        else f"{r.get('key')} was not held; its next token is still advanced"
    )
    print(
        _rows([("operator", r.get("operator")), ("reason", r.get("reason")), ("at", r.get("at"))])
    )
    print("note: revoking restores availability; it does not undo a side effect in flight")
    return 0


def _cmd_bump_epoch(args: argparse.Namespace) -> int:
    body = {
        "min_epoch": args.min_epoch,
        "operator": _require(args.operator, "--operator"),
        "reason": _require(args.reason, "--reason"),
    }
    r = _call(args, "POST", "/v1/epoch/bump", json=body)
    print(f"token epoch is now {r.get('epoch')}: every key's next token is above any issued before")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from lockservice.server import main as serve

    serve()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lockservice", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def client_cmd(name: str, help_: str, func: Callable[[argparse.Namespace], int]) -> Any:
        p = sub.add_parser(name, help=help_)
        p.add_argument("--url", help=f"lock server URL (default $LOCK_URL or {DEFAULT_URL})")
        p.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
        p.set_defaults(func=func)
        return p

    serve = sub.add_parser("serve", help="run the lock server (settings from LOCK_* variables)")
    serve.set_defaults(func=_cmd_serve)

    ins = client_cmd("inspect", "show holder, token, times and waiters of a key", _cmd_inspect)
    ins.add_argument("key")

    rev = client_cmd("revoke", "force-revoke a key's current grant (audited)", _cmd_revoke)
    rev.add_argument("key")
    rev.add_argument("--operator", help="your identity (required)")
    rev.add_argument("--reason", help="why (required; goes to the audit log)")

    bump = client_cmd("bump-epoch", "restore procedure: raise the token epoch", _cmd_bump_epoch)
    bump.add_argument("--min-epoch", type=int, required=True)
    bump.add_argument("--operator", help="your identity (required)")
    bump.add_argument("--reason", help="why (required; goes to the audit log)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
