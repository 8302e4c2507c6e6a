"""Bearer-token credentials: who is calling, for every HTTP service and operator command.

Owns: the credentials file a server loads (SHA-256 digests of tokens, each mapped to an identity
and its kind: an `operator` or a named `component`), constant-time authentication of a presented
token, the FastAPI dependency that answers 401 (no or unknown credential) or 403 (known, not
allowed here) before a handler runs, reading a client's token from a file or an environment
value, and generating tokens and credentials files for a local stack.
Must never: keep or log a token on the server side (only digests), compare digests with `==`,
import anything of the project, or let a handler run for a request it refused.

File format (JSON, mode 0600; group or other access is refused)::

    {"credentials": [{"sha256": "<hex digest of the token>", "identity": "local-operator",
                      "kind": "operator"},
                     {"sha256": "...", "identity": "worker", "kind": "component"}]}

Tokens are opaque (`secrets.token_urlsafe(32)`, 256 bits); a digest of such a token reveals
nothing usable, so the server side needs no slow hash.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from common.exiting import refuse

Kind = Literal["operator", "component"]
KINDS: tuple[Kind, ...] = ("operator", "component")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.@\-]{1,64}$")
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
#: The identity a request carries when its service runs with authentication off (no credentials
#: file: tests' negative controls only; every service's `main()` refuses to start that way).
UNAUTHENTICATED = "unauthenticated"


class CredentialsError(ValueError):
    """A credentials or token file is missing, unreadable, too open, or malformed (one line)."""


@dataclass(frozen=True)
class Identity:
    """Who a credential says the caller is."""

    name: str
    kind: Kind | Literal["none"]

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"


ANONYMOUS = Identity(UNAUTHENTICATED, "none")


def token_digest(token: str) -> str:
    """The SHA-256 hex digest of a token, as the credentials file stores it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise CredentialsError(f"{path}: not a regular file")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(
            f"{path}: readable by others (mode {stat.S_IMODE(mode):o}); use 0600"
        )


class Credentials:
    """The digests one server accepts; `authenticate` compares in constant time."""

    def __init__(self, entries: Iterable[tuple[str, Identity]]) -> None:
        self._entries = [(bytes.fromhex(d), ident) for d, ident in entries]

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        p = Path(path)
        try:
            _check_private(p)
            raw = json.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CredentialsError(f"{p}: cannot read credentials ({exc.strerror})") from exc
        except json.JSONDecodeError as exc:
            raise CredentialsError(f"{p}: not JSON ({exc.msg}, line {exc.lineno})") from exc
        except UnicodeDecodeError as exc:
            raise CredentialsError(f"{p}: not UTF-8 text (byte {exc.start})") from exc
        return cls(_parse(raw, p))

    @property
    def identities(self) -> list[Identity]:
        return [ident for _, ident in self._entries]

    def authenticate(self, token: str | None) -> Identity | None:
        """The identity whose digest matches `token`, or None. Every entry is compared (no early
        exit), each with hmac.compare_digest, so timing says nothing about which one matched."""
        if not token:
            return None
        presented = hashlib.sha256(token.encode("utf-8")).digest()
        found: Identity | None = None
        for digest, ident in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = ident
        return found


def _parse(raw: Any, where: Path) -> list[tuple[str, Identity]]:
    items = raw.get("credentials") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise CredentialsError(f'{where}: expected {{"credentials": [...]}}')
    out: list[tuple[str, Identity]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise CredentialsError(f"{where}: credentials[{i}] is not an object")
        digest, name, kind = item.get("sha256"), item.get("identity"), item.get("kind")
        if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
            raise CredentialsError(f"{where}: credentials[{i}].sha256 is not a hex SHA-256")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise CredentialsError(f"{where}: credentials[{i}].identity is not a valid name")
        if kind not in KINDS:
            raise CredentialsError(f"{where}: credentials[{i}].kind must be one of {KINDS}")
        out.append((digest, Identity(name, kind)))
    return out


def load_optional(path: str | Path | None) -> Credentials | None:
    """`Credentials.load(path)`, or None (authentication off) when no path is configured."""
    return None if path is None or str(path) == "" else Credentials.load(path)


# --------------------------------------------------------------------------- server side

_bearer_scheme = HTTPBearer(auto_error=False, description="a per-operator or per-component token")


#: The OpenAPI description of what `require` answers, for a service's `FastAPI(responses=...)`:
#: declared once so that every spec states the same refusals.
REFUSAL_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "no or unknown credential"},
    403: {"description": "a credential not allowed here"},
}


def require(
    credentials: Credentials | None,
    *,
    operator: bool = False,
    components: Collection[str] = (),
) -> Callable[..., Any]:
    """A FastAPI dependency (`Depends(require(...))`) that yields the caller's Identity.

    No or unknown bearer token: 401 (with `WWW-Authenticate: Bearer`); a known one that is not an
    operator (when `operator`) nor one of `components`: 403. Raised before the handler runs, so
    nothing changes. `credentials` None is authentication off: every caller is ANONYMOUS (the
    negative control; a service's process entry refuses to start without a credentials file)."""
    return as_dependency(authorizer(credentials, operator=operator, components=components))


def as_dependency(check: Callable[[str | None], Identity]) -> Callable[..., Any]:
    """The FastAPI dependency that makes the decision `check` (an `authorizer`) on the request's
    bearer token: what `require` returns, for a server that also needs `check` itself."""

    async def dependency(
        bearer: HTTPAuthorizationCredentials | None = Depends(_bearer_scheme),  # noqa: B008
    ) -> Identity:
        return check(None if bearer is None else bearer.credentials)

    return dependency


def authorizer(
    credentials: Credentials | None,
    *,
    operator: bool = False,
    components: Collection[str] = (),
) -> Callable[[str | None], Identity]:
    """The decision `require` makes, as a plain function of the presented bearer token (None:
    none): the caller's Identity, or HTTPException 401/403 exactly as `require` answers. For a
    server that must decide without FastAPI's dependency machinery (lockservice's hot routes)."""
    allowed = frozenset(components)

    def check(token: str | None) -> Identity:
        if credentials is None:
            return ANONYMOUS
        ident = credentials.authenticate(token)
        if ident is None:
            raise HTTPException(
                status_code=401,
                detail="missing or unknown credential",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if (operator and ident.is_operator) or (
            ident.kind == "component" and ident.name in allowed
        ):
            return ident
        raise HTTPException(status_code=403, detail=f"{ident.name} may not call this endpoint")

    return check


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, parsed as the dependency
    `require` uses parses it (FastAPI's HTTPBearer: scheme case-insensitive), else None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if not (authorization and scheme and token) or scheme.lower() != "bearer":
        return None
    return token


# --------------------------------------------------------------------------- client side


def read_token(
    *, token: str | None = None, token_file: str | Path | None = None, what: str = "token"
) -> str | None:
    """A client's token: `token` (an environment value) if set, else the first line of
    `token_file`, else None. A named file that cannot be read or is empty is an error."""
    if token:
        return token.strip()
    if token_file is None or str(token_file) == "":
        return None
    p = Path(token_file)
    try:
        text = p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CredentialsError(f"{what} file {p}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise CredentialsError(f"{what} file {p}: not UTF-8 text (byte {exc.start})") from exc
    if not text:
        raise CredentialsError(f"{what} file {p} is empty")
    return text.splitlines()[0].strip()


def auth_headers(token: str | None) -> dict[str, str]:
    """The `Authorization` header for a token (none for None)."""
    return {} if not token else {"Authorization": f"Bearer {token}"}


# --------------------------------------------------------------------------- generation


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def issue_tokens(directory: str | Path, identities: Mapping[str, Kind]) -> dict[str, Path]:
    """One token file (`<name>.token`, 0600) per identity under `directory`; an existing file is
    kept, so a stack restarted on its run directory keeps its credentials."""
    out: dict[str, Path] = {}
    for name in identities:
        if not _NAME_RE.match(name):
            raise CredentialsError(f"not a valid identity name: {name!r}")
        path = Path(directory) / f"{name}.token"
        if not path.exists():
            _write_private(path, secrets.token_urlsafe(32) + "\n")
        out[name] = path
    return out


def write_credentials(
    path: str | Path, identities: Mapping[str, Kind], token_files: Mapping[str, Path]
) -> Path:
    """A server's credentials file (0600) accepting exactly `identities`."""
    entries = []
    for name, kind in identities.items():
        token = read_token(token_file=token_files[name], what=name)
        assert token is not None
        entries.append({"sha256": token_digest(token), "identity": name, "kind": kind})
    p = Path(path)
    _write_private(p, json.dumps({"credentials": entries}, indent=2) + "\n")
    return p


#: Where every operator command line (`payouts`, `python -m lockservice`, `payouts outbox`) finds
#: the operator's token: the value itself, or a file holding it (the stack prints the export line).
OPERATOR_TOKEN_ENV = "PAYOUTS_OPERATOR_TOKEN"  # noqa: S105 - a variable name, not a secret
OPERATOR_TOKEN_FILE_ENV = "PAYOUTS_OPERATOR_TOKEN_FILE"  # noqa: S105 - a variable name


def operator_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The operator's token from $PAYOUTS_OPERATOR_TOKEN or the file $PAYOUTS_OPERATOR_TOKEN_FILE
    names (None if neither is set)."""
    env = os.environ if environ is None else environ
    return read_token(
        token=env.get(OPERATOR_TOKEN_ENV),
        token_file=env.get(OPERATOR_TOKEN_FILE_ENV),
        what=OPERATOR_TOKEN_FILE_ENV,
    )


def authenticate_operator(credentials_path: str | Path | None, token: str | None) -> Identity:
    """For a command line that acts without a server in between (an offline command, the outbox
    commands): check the operator's token against a credentials file before acting, and return
    the identity to audit. Raises CredentialsError (one line) when it cannot."""
    if not credentials_path:
        raise CredentialsError("no credentials file configured to check the operator's token")
    if not token:
        raise CredentialsError(
            f"no operator token: set {OPERATOR_TOKEN_FILE_ENV} (or {OPERATOR_TOKEN_ENV})"
        )
    ident = Credentials.load(credentials_path).authenticate(token)
    if ident is None:
        raise CredentialsError("the operator token is not known to the credentials file")
    if not ident.is_operator:
        raise CredentialsError(f"{ident.name} is a component credential, not an operator's")
    return ident


def refuse_without(path: object, variable: str, service: str) -> None:
    """A service's process entry: exit 2 with one stderr line unless its credentials file is
    configured and loads (safe default: a service never serves unauthenticated by accident)."""
    if path is None or str(path) == "":
        refuse(
            service,
            f"{variable} is not set (the accepted bearer-token digests, common.credentials): "
            "refusing to start",
        )
    try:
        Credentials.load(str(path))
    except CredentialsError as exc:
        refuse(service, f"{variable}: {exc}: refusing to start")


def refuse_unreadable_token(path: object, variable: str, service: str) -> None:
    """A process entry: exit 2 with one stderr line if the token file `variable` names cannot be
    read, is not UTF-8 or is empty, before anything has started (a process that found out later
    would have half-started: a pool open, a port bound). Unset is allowed: no credential is sent,
    and an authenticating server refuses the calls."""
    try:
        read_token(token_file=None if path is None else str(path), what=variable)
    except CredentialsError as exc:
        refuse(service, f"{exc}: refusing to start")
