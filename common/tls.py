"""TLS in transit (issue 27 §1): the settings every server and client takes, and the
`ssl.SSLContext` each one builds from them.

Owns: the check of a component's PostgreSQL DSN (`database_url_problem`: verified TLS to any
server that is not on this machine, and no explicit `sslmode` that skips verification), the
per-component TLS settings, mixed into each component's pydantic settings under its
own prefix (`<PREFIX>_TLS_CERT_FILE` / `<PREFIX>_TLS_KEY_FILE` for a server, `<PREFIX>_TLS_CA_FILE`
/ `<PREFIX>_TLS_VERIFY` for a client; docs/security.md, "Encryption in transit"), the refusal of a
client that turns verification off outside experiment mode (the FR-29 pattern), and the server
and client contexts. A client context always verifies the server's chain against the given CA
and checks its host name. The certificates themselves are issued elsewhere (`stack.pki` for the
local stack, the deployment's own CA in production).
Must never: issue a certificate, read a private key's bytes into a log or an error, or build a
client context without verification unless the settings passed their experiment-mode check.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import model_validator
from pydantic_settings import BaseSettings


class TLSSettingsError(ValueError):
    """A TLS setting is incomplete or refused; the message names the variable."""


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context presenting `cert_file` (the chain, PEM) with `key_file`, TLS 1.2+."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def client_context(
    ca_file: str, *, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client context that trusts only `ca_file`, checks the host name (the default of
    `create_default_context`, kept on) and, given both, presents a client certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    assert ctx.check_hostname and ctx.verify_mode is ssl.CERT_REQUIRED
    if cert_file and key_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def uvicorn_ssl(cert_file: str | None, key_file: str | None) -> dict[str, Any]:
    """uvicorn's keyword arguments: TLS only with both files, nothing (plain HTTP) with neither."""
    if not cert_file and not key_file:
        return {}
    if not cert_file or not key_file:
        raise TLSSettingsError("a server's TLS needs both its certificate and its key file")
    for path in (cert_file, key_file):
        if not Path(path).is_file():
            raise TLSSettingsError(f"TLS file {path} does not exist")
    return {"ssl_certfile": cert_file, "ssl_keyfile": key_file}


def _prefix(model: BaseSettings) -> str:
    return str(model.model_config.get("env_prefix") or "")


class ServerTLS(BaseSettings):
    """A server's certificate and key (PEM paths): both set, it serves TLS only; neither, plain
    HTTP (a deployment whose mesh terminates TLS). One without the other is refused."""

    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> ServerTLS:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            p = _prefix(self)
            raise TLSSettingsError(
                f"{p}TLS_CERT_FILE and {p}TLS_KEY_FILE are set together or not at all"
            )
        return self

    def uvicorn_ssl(self) -> dict[str, Any]:
        return uvicorn_ssl(self.tls_cert_file, self.tls_key_file)

    def server_context(self) -> ssl.SSLContext | None:
        """The context a non-uvicorn server wraps its socket with; None: plain HTTP."""
        if not self.tls_cert_file or not self.tls_key_file:
            return None
        return server_context(self.tls_cert_file, self.tls_key_file)


class ClientTLS(BaseSettings):
    """What a client trusts: `tls_ca_file` (PEM), or the system's trust store when unset.
    `tls_verify=false` (no verification at all) is refused unless the component's own
    `experiment_mode` setting is true: the FR-29 pattern of the fencing switches."""

    tls_ca_file: str | None = None
    tls_verify: bool = True

    @model_validator(mode="after")
    def _verification_off_only_in_experiments(self) -> ClientTLS:
        if not self.tls_verify and not getattr(self, "experiment_mode", False):
            p = _prefix(self)
            raise TLSSettingsError(
                f"{p}TLS_VERIFY=false (no server verification) is refused outside experiment "
                f"mode (FR-29): set {p}TLS_CA_FILE to the CA that issued the server's certificate"
            )
        return self

    def client_verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify=`: a context trusting the CA file, True (the system's store, or
        SSL_CERT_FILE) without one, False only when the experiment check above passed."""
        if not self.tls_verify:
            return False
        if self.tls_ca_file:
            return client_context(self.tls_ca_file)
        return True


#: libpq's modes that encrypt (or may) without verifying the server: a path can read and change
#: the session. asyncpg's `no-verify` is the same.
UNVERIFIED_SSLMODES = frozenset({"allow", "prefer", "require", "no-verify"})
#: The modes that verify the server's chain against `sslrootcert` (verify-full also its name;
#: verify-ca is what Cloud SQL documents for a connection by IP address).
VERIFIED_SSLMODES = frozenset({"verify-ca", "verify-full"})


def _hosts(url: str) -> list[str]:
    """Every host a DSN may connect to: the netloc's (a multi-host list) and `?host=` ones."""
    parts = urlsplit(url)
    hosts: list[str] = []
    for item in parts.netloc.rpartition("@")[2].split(","):
        host = item.strip()
        if host.startswith("["):
            host = host[1:].partition("]")[0]
        elif host.count(":") == 1:
            host = host.partition(":")[0]
        hosts.append(host)
    for value in parse_qs(parts.query).get("host", []):
        hosts += [h.strip() for h in value.split(",")]
    return hosts


def _is_local(host: str) -> bool:
    """A Unix socket (a path, or no host at all) or a loopback address: nothing on a network."""
    if not host or host.startswith("/") or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def database_url_problem(url: str, variable: str) -> str | None:
    """Why the PostgreSQL DSN in `variable` would let the session be read or redirected on its
    way, or None. Refused: an `sslmode` that encrypts without verifying (whatever the host),
    and anything short of verify-ca/verify-full to a host that is not this machine (libpq's and
    asyncpg's default, `prefer`, takes any certificate and falls back to plaintext). Allowed:
    loopback and Unix sockets without TLS (a sidecar such as the Cloud SQL Auth Proxy, the
    tests' own server), since nothing crosses a network there. `PGSSLMODE` counts when the DSN
    names no mode, as it does for asyncpg."""
    query = parse_qs(urlsplit(url).query)
    mode = (query.get("sslmode") or query.get("ssl") or [os.environ.get("PGSSLMODE", "")])[0]
    fix = "use sslmode=verify-full with sslrootcert=<the CA that issued the server's certificate>"
    if mode in UNVERIFIED_SSLMODES:
        return f"{variable} asks for sslmode={mode}, TLS without verifying the server; {fix}"
    remote = [h for h in _hosts(url) if not _is_local(h)]
    if remote and mode not in VERIFIED_SSLMODES:
        shown = f"sslmode={mode}" if mode else "no sslmode"
        return f"{variable} reaches {remote[0]} with {shown}, not verified TLS; {fix}"
    return None


def refuse_unverified_database_url(
    url: str | None, variable: str, *, experiment_mode: bool = False
) -> None:
    """A settings validator's half: raise TLSSettingsError for `database_url_problem`, unless
    the component's own experiment mode allows it (the FR-29 pattern)."""
    problem = database_url_problem(url, variable) if url else None
    if problem and not experiment_mode:
        raise TLSSettingsError(f"{problem} (refused outside experiment mode, FR-29)")
